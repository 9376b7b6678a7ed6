"""CPU inference benchmark: the toolkit's backends against outside runtimes, on the same
model in the same run, at fp32, bf16 and int8.

    .venv/bin/pip install -r requirements-tools.txt
    scripts/setup_nncf.sh     # NNCF beside the venv, in .nncf-site (see --nncf-site)
    .venv/bin/python scripts/benchmark_inference.py --arch resnet50 --batch-sizes 1,32

One ResNet (randomly initialised: speed does not depend on the weights) is exported
with export_model.py, once more quantized to int8 (--ptq-algo abs_max, calibrated on
64 real images of --calibration-root), converted to ONNX with paddle2onnx, and all run
on the same input in the same process.

The toolkit's backends, as inference.py runs them, are the contenders: Paddle Inference
with oneDNN (``paddle <precision>``) and its OpenVINO backend (``toolkit openvino
<precision>``, int8 on the export's PTQ scales). The peers are outside runtimes only:
- onnxruntime on model.onnx: fp32, and int8 by its own static QDQ quantization;
- plain OpenVINO on the same exported file (``openvino.Core().read_model`` of its
  .pdmodel) at fp32 and bf16 (``INFERENCE_PRECISION_HINT``; onnxruntime has no CPU bf16);
- OpenVINO's own int8: model.onnx read by OpenVINO and quantized by NNCF (preset
  performance), compiled by plain OpenVINO.
Each int8 model is calibrated on the same 64 images, and runs its other layers in fp32.
Without NNCF (scripts/setup_nncf.sh, found by --nncf-site) the benchmark stops at once
in one line: an int8 ratio without OpenVINO's own int8 would compare against a weaker
peer under the same name. Plain OpenVINO compiles a
static-shape model for each batch size, with all cores' threads and whichever of the
LATENCY and THROUGHPUT hints runs that batch faster in a short trial (the winner is
recorded). Plain OpenVINO on the export's int8 model.onnx is also run: not a peer (the
scales are the toolkit's), but the same file as the toolkit's OpenVINO int8.

In each of --repeats rounds every runtime runs a slice of --slice-seconds per batch size,
in turn (A B C ... A B C ...), so a shared machine's load falls on the slices side by
side; each runtime's speed is the median of its slices, and each ratio the median of the
per-round ratios of the two runtimes' slices, with its spread (``core/interleave.py``),
not a ratio of medians. Prints a table and writes to --output the per-runtime figures,
what OpenVINO ran (hint, streams, each layer's precision, the CPU's capabilities) and the
ratios per precision and batch: the fastest toolkit backend against the fastest peer of
that precision, and the toolkit's OpenVINO against plain OpenVINO on the same file.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import paddle

from paddle_resnet.core import feeds, interleave
from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import InferenceConfig, build_config
from paddle_resnet.core.config.keys import IRS
from paddle_resnet.core.devices import cpu_has_int8_dot_products
from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.metrics import time_steps
from paddle_resnet.core.optional import require
from paddle_resnet.data.folder import scan_split
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported, nncf_int8, onnx_export, onnx_runtime, predictor
from paddle_resnet.deploy.openvino_runtime import (
    HINTS,
    OpenVinoClassifier,
    PerBatchSize,
    capabilities,
    compile_for_batch,
    layer_precisions,
)
from paddle_resnet.training import ir, prepare

PRECISIONS = ("fp32", "bf16", "int8")
# every int8 model (the export's PTQ, onnxruntime's, NNCF's) is calibrated on these many images
CALIBRATION_IMAGES = 64
NNCF_PRESET = "performance"  # NNCF's preset for CNNs on the CPU (deploy/nncf_int8.py)
# plain OpenVINO's hint trial: about this long for each hint (median of the runs)
TRIAL_SECONDS = 1.0


@dataclass
class Runtime:
    name: str
    precision: str
    role: str  # "toolkit" (a contender), "peer" (outside), "same file" (neither: see docstring)
    run: Callable
    per_batch: Optional[PerBatchSize] = None  # an OpenVINO runtime's compiled models
    plain_twin: Optional[str] = None  # a toolkit OpenVINO row: plain OpenVINO on its file


def export_random_models(args, workdir):
    """Inference models of ``args.arch`` with its initial weights, fp32 and int8, from the
    IR of ``args.ir``; returns their folders."""
    values = {
        "model.arch": args.arch,
        "data.crop_size": args.size,
        "data.resize_short": args.size,
        "run.ir": args.ir,
    }
    config = build_config(values)
    prefix = os.path.join(workdir, "initial")
    with ir.selected(config):  # the programs an evaluation of this config prepares
        programs, _ = prepare.ready_for_weights(config, False, 1, None, paddle.CPUPlace())
        paddle.static.save(programs.eval, prefix)
    values["run.from_pretrained_params"] = prefix + ".pdparams"
    folders = []
    for name, extra in (
        ("fp32", {}),
        (
            "int8",
            {
                "inference.ptq_algo": "abs_max",
                "inference.calibration_images": CALIBRATION_IMAGES,
                "data.image_root": args.calibration_root,
                # model.onnx beside it: the file both OpenVINOs read
                "inference.onnx": True,
            },
        ),
    ):
        folders.append(os.path.join(workdir, name))
        exporting.export(
            build_config(
                dict(
                    values,
                    **extra,
                    **{
                        "inference.model_dir": folders[-1],
                        "inference.export_log_path": folders[-1] + ".json",
                    },
                )
            )
        )
    return folders


def calibration_batches(model_dir, calibration_root):
    """The export's PTQ calibration images (``export.calibration_batches``), in batches
    of 16."""
    config = build_config(
        {
            "data.image_root": calibration_root,
            "data.batch_size": 16,
            "inference.calibration_images": CALIBRATION_IMAGES,
        }
    )
    batches = exporting.calibration_batches(config, exported.read_info(model_dir))
    return [batch[feeds.IMAGE] for batch in batches]


def onnx_runner(path, threads):
    session = onnx_runtime.session(path, threads)
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def ort_static_int8(fp32_path, batches, workdir):
    """The fp32 ONNX model quantized by onnxruntime itself (static, QDQ, per-channel
    weights), calibrated on ``batches``: its int8 peer."""
    quantization = require("onnxruntime.quantization", "the onnxruntime int8 peer")
    inputs = [{feeds.IMAGE: batch} for batch in batches]

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.inputs = iter(inputs)

        def get_next(self):
            return next(self.inputs, None)

    path = os.path.join(workdir, "model_int8_ort.onnx")
    quantization.quantize_static(
        fp32_path,
        path,
        Reader(),
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=True,
        activation_type=quantization.QuantType.QInt8,
        weight_type=quantization.QuantType.QInt8,
    )
    return path


def steps_filling(seconds, run):
    """How many calls of ``run`` take about ``seconds`` (at least 3), from one (untimed
    from then on) call."""
    start = time.perf_counter()
    run()
    return max(3, int(seconds / max(time.perf_counter() - start, 1e-3)))


def fastest_hint_compile(core, model, image_shape, batch_size, settings, trials):
    """``model`` compiled for ``batch_size`` with whichever of the LATENCY and
    THROUGHPUT hints runs one batch faster in a short trial; the trial's median
    milliseconds per hint go to ``trials[batch_size]``."""
    images = np.random.default_rng(0).standard_normal((batch_size, *image_shape), np.float32)
    timed = {}
    for hint in ("LATENCY", "THROUGHPUT"):
        compiled = compile_for_batch(
            core, model, image_shape, batch_size, dict(settings, PERFORMANCE_HINT=hint)
        )
        infer = functools.partial(compiled.create_infer_request().infer, {0: images})
        seconds = time_steps(infer, 0, steps_filling(TRIAL_SECONDS, infer))
        timed[hint] = (float(np.median(seconds)) * 1000, compiled)
    trials[batch_size] = {hint: round(ms, 2) for hint, (ms, _) in timed.items()}
    return min(timed.values(), key=lambda entry: entry[0])[1]


def plain_openvino(core, model, image_shape, precision, threads, trials):
    """Plain OpenVINO running ``model`` at ``precision``: a static-shape model per batch
    size, under the faster hint (``fastest_hint_compile``) on all ``threads``. An int8
    model's other layers run in fp32, as the toolkit's OpenVINO int8 runs them."""
    settings = {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": HINTS.get(precision, "f32"),
    }
    return PerBatchSize(
        lambda batch_size: fastest_hint_compile(
            core, model, image_shape, batch_size, settings, trials
        )
    )


def build_runtimes(args, workdir, threads, ov):
    """Every runtime of the benchmark, and plain OpenVINO's hint trials (by runtime)."""
    model_dir, int8_dir = export_random_models(args, workdir)
    onnx_path = onnx_export.write_onnx(model_dir)
    pir = exported.is_pir_export(model_dir)
    batches = calibration_batches(model_dir, args.calibration_root)
    image_shape = (3, args.size, args.size)
    core = ov.Core()
    trials = {}

    def plain(name, precision, role, model):
        trials[name] = {}
        runner = plain_openvino(core, model, image_shape, precision, threads, trials[name])
        return Runtime(name, precision, role, runner, per_batch=runner)

    # the exported Paddle program as OpenVINO reads it (a PIR export: through its ONNX)
    fp32_file = core.read_model(onnx_path if pir else exported.model_paths(model_dir)[0])
    runtimes = [
        Runtime("onnxruntime fp32", "fp32", "peer", onnx_runner(onnx_path, threads)),
        Runtime(
            "onnxruntime int8",
            "int8",
            "peer",
            onnx_runner(ort_static_int8(onnx_path, batches, workdir), threads),
        ),
        plain("openvino fp32", "fp32", "peer", fp32_file),
        *(
            [plain("openvino bf16", "bf16", "peer", fp32_file)]
            if "bf16" in machine_precisions()
            else []
        ),
        plain(
            "openvino int8 (nncf)",
            "int8",
            "peer",
            core.read_model(
                nncf_int8.quantize(
                    args.nncf_site,
                    onnx_path,
                    batches,
                    NNCF_PRESET,
                    os.path.join(workdir, "nncf_int8.xml"),
                )
            ),
        ),
        plain(
            "openvino int8 (export's scales)",
            "int8",
            "same file",
            core.read_model(os.path.join(int8_dir, exported.ONNX_FILE)),
        ),
    ]
    twins = {
        "fp32": "openvino fp32",
        "bf16": "openvino bf16",
        "int8": "openvino int8 (export's scales)",
    }
    max_batch = max(args.batch_sizes)
    for precision in machine_precisions():
        folder = int8_dir if precision == "int8" else model_dir
        settings = InferenceConfig(cpu_precision=precision)
        if not (precision == "int8" and (pir or not cpu_has_int8_dot_products())):
            # Paddle's int8 is oneDNN's: not for PIR programs, nor without int8 dot products
            calls = predictor.predictor_settings(
                settings,
                "cpu",
                list(image_shape),
                64,
                quantized=precision == "int8",
                pir_export=pir,
            )
            runtimes.append(
                Runtime(
                    f"paddle {precision}",
                    precision,
                    "toolkit",
                    predictor.Classifier(folder, calls, list(image_shape)),
                )
            )
        openvino = OpenVinoClassifier(
            folder, settings, list(image_shape), max_batch, quantized=precision == "int8"
        )
        print(f"toolkit openvino {precision}: {openvino.describe()}", flush=True)
        runtimes.append(
            Runtime(
                f"toolkit openvino {precision}",
                precision,
                "toolkit",
                openvino,
                per_batch=openvino.per_batch,
                plain_twin=twins[precision],
            )
        )
    return runtimes, trials, capabilities(core)


def machine_precisions():
    """The precisions this CPU computes in (bf16 needs avx512_bf16 or AMX)."""
    return [p for p in PRECISIONS if p != "bf16" or predictor.cpu_supports_bf16()]


def warm(runtimes, batch_sizes, image_shape):
    """One call of each runtime per batch size, before any timing: the OpenVINO runtimes
    compile a model per batch size there (plain OpenVINO after its hint trial)."""
    for batch_size in batch_sizes:
        batch = np.zeros((batch_size, *image_shape), np.float32)
        for runtime in runtimes:
            runtime.run(batch)


def timed_rounds(runtimes, batch_sizes, image_shape, args):
    """``args.repeats`` rounds; in each, per batch size, every runtime runs a slice of
    ``args.slice_seconds`` in turn (A B C ... A B C ...: ``core/interleave.py``)."""
    rng = np.random.default_rng(0)
    rounds = []
    for repeat in range(args.repeats):
        for batch_size in batch_sizes:
            batch = rng.standard_normal((batch_size, *image_shape)).astype(np.float32)
            for runtime in runtimes:
                run = functools.partial(runtime.run, batch)
                ips = interleave.run_slice(run, batch_size, args.slice_seconds)
                rounds.append(
                    {
                        "runtime": runtime.name,
                        "batch_size": batch_size,
                        "ips": ips,
                        "repeat": repeat,
                    }
                )
                print(
                    f"round {repeat + 1} {runtime.name:32s} batch {batch_size:3d}: {ips:7.1f} img/s",
                    flush=True,
                )
    return rounds


def medians(rounds, runtimes, batch_sizes):
    """Each runtime's median over the rounds, per batch size."""
    results = []
    for batch_size in batch_sizes:
        for runtime in runtimes:
            runs = [
                r["ips"]
                for r in rounds
                if r["runtime"] == runtime.name and r["batch_size"] == batch_size
            ]
            results.append(
                {
                    "runtime": runtime.name,
                    "role": runtime.role,
                    "precision": runtime.precision,
                    "batch_size": batch_size,
                    "ips": float(np.median(runs)),
                    "ips_runs": [round(ips, 1) for ips in runs],
                    "latency_ms": 1000.0 * batch_size / float(np.median(runs)),
                }
            )
    return results


def print_medians(results):
    print(f"\n{'runtime':32s} {'role':9s} {'batch':>5} {'img/s':>9} {'ms/batch':>9}")
    for r in results:
        print(
            f"{r['runtime']:32s} {r['role']:9s} {r['batch_size']:5d} {r['ips']:9.1f} "
            f"{r['latency_ms']:9.2f}"
        )


def compared_pairs(runtimes, ips, batch_size):
    """(ratio name, toolkit runtime, outside runtime) at ``batch_size``: per precision the
    fastest toolkit backend against the fastest peer, and each toolkit OpenVINO row
    against plain OpenVINO on the same file."""

    def fastest(role, precision):
        names = [r.name for r in runtimes if r.role == role and r.precision == precision]
        return max(names, key=lambda name: ips[name, batch_size])

    for precision in machine_precisions():
        yield (
            f"best toolkit backend / fastest outside runtime, {precision}, batch {batch_size}",
            fastest("toolkit", precision),
            fastest("peer", precision),
        )
    for runtime in runtimes:
        if runtime.plain_twin:
            yield (
                f"toolkit openvino / plain openvino on the same file, {runtime.precision}, "
                f"batch {batch_size}",
                runtime.name,
                runtime.plain_twin,
            )


def speed_ratios(results, rounds, runtimes, batch_sizes):
    """Each compared pair (``compared_pairs``, the fastest by the medians) by its name: the
    median of its per-round ratios (each round's slices side by side), with their spread."""
    ips = {(r["runtime"], r["batch_size"]): r["ips"] for r in results}

    def slices(name, size):
        return [r["ips"] for r in rounds if r["runtime"] == name and r["batch_size"] == size]

    return {
        name: dict(
            interleave.paired_ratio(slices(ours, size), slices(theirs, size)),
            toolkit=ours,
            outside=theirs,
        )
        for size in batch_sizes
        for name, ours, theirs in compared_pairs(runtimes, ips, size)
    }


def openvino_facts(runtime, trials):
    """What OpenVINO ran for ``runtime``, per batch size, as it reports it."""
    facts = {}
    for batch_size, compiled in sorted(runtime.per_batch.compiled_models().items()):
        facts[batch_size] = {
            "hint": compiled.get_property("PERFORMANCE_HINT"),
            "streams": int(compiled.get_property("NUM_STREAMS")),
            "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
            "inference_precision": compiled.get_property("INFERENCE_PRECISION_HINT").to_string(),
            "layer_precisions": layer_precisions(compiled),
        }
        if batch_size in trials:
            facts[batch_size]["hint_trial_ms"] = trials[batch_size]
    return facts


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument(
        "--batch-sizes", default=[1, 32], type=lambda text: [int(b) for b in text.split(",")]
    )
    parser.add_argument("--slice-seconds", type=float, default=3.0, help="each runtime's turn")
    parser.add_argument("--repeats", type=int, default=8, help="rounds of turns")
    parser.add_argument(
        "--calibration-root",
        default="demo_data/fashion_mnist_demo",
        help="an image tree whose train/ images calibrate the int8 models",
    )
    parser.add_argument(
        "--nncf-site",
        default=nncf_int8.DEFAULT_SITE,
        help="the folder scripts/setup_nncf.sh installed NNCF into",
    )
    parser.add_argument(
        "--ir",
        choices=IRS,
        default="legacy",
        help="the IR the models are exported from (pir: Paddle 3; its int8 is the toolkit's "
        "own calibration and int8 model.onnx)",
    )
    parser.add_argument("--output", default="benchmarks/inference_resnet50_cpu.json")
    return parser.parse_args()


def main():
    args = parse_args()
    scan_split(args.calibration_root, "train")  # its own input first, then the packages
    onnxruntime = require("onnxruntime", "the ONNX peers of this benchmark")
    ov = require("openvino", "the OpenVINO peers of this benchmark")
    nncf_version = nncf_int8.version(args.nncf_site, "the NNCF int8 peer of this benchmark")
    threads = available_cores()
    workdir = tempfile.mkdtemp(prefix="bench_inference_")
    runtimes, trials, cpu_capabilities = build_runtimes(args, workdir, threads, ov)
    image_shape = (3, args.size, args.size)
    warm(runtimes, args.batch_sizes, image_shape)
    rounds = timed_rounds(runtimes, args.batch_sizes, image_shape, args)
    results = medians(rounds, runtimes, args.batch_sizes)
    print_medians(results)
    ratios = speed_ratios(results, rounds, runtimes, args.batch_sizes)
    for name, entry in ratios.items():
        print(
            f"{name}: {entry['median']:.2f}x ({entry['min']:.2f}-{entry['max']:.2f}; "
            f"{entry['toolkit']} / {entry['outside']})"
        )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(
            {
                "arch": args.arch,
                "size": args.size,
                "threads": threads,
                "paddle": paddle.__version__,
                "ir": args.ir,
                "onnxruntime": onnxruntime.__version__,
                "openvino": {
                    "version": ov.__version__,
                    "cpu_capabilities": sorted(cpu_capabilities),
                    "runtimes": {
                        r.name: openvino_facts(r, trials.get(r.name, {}))
                        for r in runtimes
                        if r.per_batch
                    },
                },
                "nncf": {
                    "version": nncf_version,
                    "preset": NNCF_PRESET,
                    "calibration_images": CALIBRATION_IMAGES,
                    "quantized": "model.onnx as OpenVINO reads it (NNCF's OpenVINO backend)",
                },
                "repeats": args.repeats,
                "slice_seconds": args.slice_seconds,
                "results": results,
                "rounds": rounds,
                "ratios": ratios,
            },
            handle,
            indent=1,
        )


if __name__ == "__main__":
    sys.exit(exit_status(main))
