"""--enable-cpu-affinity: each GPU rank pinned to CPU cores near its GPU, as NVIDIA's
reference does (``utils/affinity.py``), read from ``nvidia-smi topo -m``. The GPUs that
share one "CPU Affinity" set (one NUMA node) split each of its core ranges in strides
(two GPUs on ``48-63,176-191``: the even cores and the odd ones), because the second
range holds the hyper-threads of the first. Unlike NVIDIA's parser, which splits rows on
tabs (published outputs have often lost some), a GPU row's affinity is its first cell
that is a CPU list.
"""

import os
import re
import subprocess

from paddle_resnet.core.errors import UserError

_CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_GPU_ROW = re.compile(r"GPU(\d+)\s")


def _cpus(cpu_list):
    """ "48-63,176-191" -> [[48, ..., 63], [176, ..., 191]]: one list per range."""
    ranges = []
    for part in cpu_list.split(","):
        low, _, high = part.partition("-")
        ranges.append(list(range(int(low), int(high or low) + 1)))
    return ranges


def gpu_affinities(topology):
    """{GPU index: its CPU list string} from the text of ``nvidia-smi topo -m``."""
    affinities = {}
    for line in topology.splitlines():
        match = _GPU_ROW.match(line)
        if not match:
            continue
        cells = [cell.strip() for cell in re.split(r"\t| {2,}", line[match.end() :])]
        cpu_list = next((cell for cell in cells if _CPU_LIST.fullmatch(cell)), None)
        if cpu_list is None:
            raise UserError(f"nvidia-smi topo -m: no CPU affinity in the row of GPU{match[1]}")
        affinities[int(match[1])] = cpu_list
    if not affinities:
        raise UserError("nvidia-smi topo -m: no GPU rows (is this an NVIDIA GPU machine?)")
    return affinities


def cores_for_gpu(affinities, gpu):
    """The CPU cores of ``gpu``'s share of its NUMA node (NVIDIA's strided split)."""
    if gpu not in affinities:
        raise UserError(
            f"--enable-cpu-affinity: nvidia-smi lists no GPU{gpu} (GPUs: {sorted(affinities)})"
        )
    node = affinities[gpu]
    neighbours = sorted(g for g, cpus in affinities.items() if cpus == node)
    share, count = neighbours.index(gpu), len(neighbours)
    return [core for cores in _cpus(node) for core in cores[share % len(cores) :: count]]


def pin_to_gpu(gpu):
    """Pin this process to ``gpu``'s cores; returns them. Called on GPU ranks only."""
    try:
        topology = subprocess.run(
            ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise UserError(
            f"--enable-cpu-affinity: nvidia-smi topo -m failed ({err}); "
            "use --enable-cpu-affinity False"
        ) from None
    cores = [core for core in cores_for_gpu(gpu_affinities(topology), gpu) if core < os.cpu_count()]
    os.sched_setaffinity(0, cores)
    return cores
