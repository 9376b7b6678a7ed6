"""Processes and devices: Fleet's collective mode, this process's device, sums over ranks.

One process per device, whether started by ``paddle.distributed.launch`` or plainly.
"""
import os

import numpy as np
import paddle
from paddle.distributed import fleet

from paddle_resnet import VERBOSE
from paddle_resnet.bootstrap import paddle_chatter


def init_fleet():
    """Fleet in collective mode (once per process); returns (rank, world size)."""
    if not fleet.fleet._role_maker:
        with paddle_chatter(VERBOSE):
            fleet.init(is_collective=True)
    return fleet.worker_index(), fleet.worker_num()


def gpu_available():
    return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


def device():
    """(place, DALI device id or None) for this process: its GPU, or the CPU."""
    if gpu_available():
        device_id = int(os.environ.get("FLAGS_selected_gpus", "0").split(",")[0])
        return paddle.CUDAPlace(device_id), device_id
    return paddle.CPUPlace(), None


def all_reduce_sum(place):
    """A function summing a small float64 vector over all ranks (a static collective op)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        counts = paddle.static.data("counts", [4], "float64")
        paddle.distributed.all_reduce(counts)
    exe = paddle.static.Executor(place)

    def reduce(values):
        return np.asarray(exe.run(main, feed={"counts": values}, fetch_list=[counts])[0])

    return reduce
