"""CPU inference benchmark: the toolkit's backends (Paddle Inference with oneDNN, and
OpenVINO) at fp32, bf16 and int8, against onnxruntime (fp32, and int8 by its own static
QDQ quantization).

    .venv/bin/pip install -r requirements-tools.txt
    .venv/bin/python scripts/benchmark_inference.py --arch resnet50 --batch-sizes 1,32

One ResNet (randomly initialised: speed does not depend on the weights) is exported
with export_model.py, once more quantized to int8 (--ptq-algo abs_max, calibrated on
real images of --calibration-root), converted to ONNX with paddle2onnx, and all run on
the same input in the same process. The OpenVINO rows are inference.py's own backend
(its int8 runs the model's PTQ scales). Each of --repeats rounds runs every runtime once
per batch size, interleaved, and the medians are reported, so a shared machine's drift
falls on all alike. Prints a table and writes the figures and the ratios (each
precision's fastest toolkit backend against the fastest runtime) to --output.
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import argparse
import json
import os
import tempfile
import time

import numpy as np
import paddle

from paddle_resnet.core import feeds
from paddle_resnet.deploy import model_input
from paddle_resnet.training import programs as program
from paddle_resnet.deploy import exported, predictor
from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import InferenceConfig, build_config
from paddle_resnet.data.dali import open_split
from paddle_resnet.core.metrics import latency_summary, time_steps
from paddle_resnet.deploy.openvino_runtime import OpenVinoClassifier
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import export as exporting


def export_random_models(arch, size, workdir, calibration_root):
    """Inference models of ``arch`` with its initial weights, fp32 and int8; returns
    their folders."""
    values = {"model.arch": arch, "data.crop_size": size, "data.resize_short": size}
    programs = program.build_programs(build_config(values), training=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(programs.startup)
    prefix = os.path.join(workdir, "initial")
    paddle.static.save(programs.eval, prefix)
    values["run.from_pretrained_params"] = prefix + ".pdparams"
    folders = []
    for name, extra in (
        ("fp32", {}),
        (
            "int8",
            {
                "inference.ptq_algo": "abs_max",
                "inference.calibration_images": 64,
                "data.image_root": calibration_root,
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


def to_onnx(model_dir, path):
    paddle2onnx = require("paddle2onnx", "the ONNX peer of this benchmark")
    paddle2onnx.export(*exported.model_paths(model_dir), path, opset_version=13)
    return path


def onnx_runner(session):
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def ort_static_int8(fp32_path, model_dir, workdir, calibration_root, count=64):
    """The fp32 ONNX model quantized by onnxruntime itself (static, QDQ, per-channel
    weights), calibrated on ``count`` real images as the export's PTQ is: its int8 peer."""
    quantization = require("onnxruntime.quantization", "the onnxruntime int8 peer")
    config = build_config({"data.image_root": calibration_root, "data.batch_size": 16})
    info = exported.read_info(model_dir)
    split = open_split(config.data, "train").spread(count)
    batches = [
        {feeds.IMAGE: b[feeds.IMAGE]}
        for b in model_input.validation_batches(split, config.data, info)
    ]

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self.batches = iter(batches)

        def get_next(self):
            return next(self.batches, None)

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch-sizes", default="1,32")
    parser.add_argument("--steps", type=int, default=0, help="timed runs (0: about 8 s each)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument(
        "--calibration-root",
        default="demo_data/fashion_mnist_demo",
        help="an image tree whose train/ images calibrate the int8 model",
    )
    parser.add_argument("--output", default="benchmarks/inference_resnet50_cpu.json")
    args = parser.parse_args()

    onnxruntime = require("onnxruntime", "the ONNX peer of this benchmark")
    threads = available_cores()
    workdir = tempfile.mkdtemp(prefix="bench_inference_")
    model_dir, int8_dir = export_random_models(args.arch, args.size, workdir, args.calibration_root)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        to_onnx(model_dir, os.path.join(workdir, "model.onnx")),
        options,
        providers=["CPUExecutionProvider"],
    )
    runners = {"onnxruntime fp32": onnx_runner(session)}
    runners["onnxruntime int8"] = onnx_runner(
        onnxruntime.InferenceSession(
            ort_static_int8(
                os.path.join(workdir, "model.onnx"), model_dir, workdir, args.calibration_root
            ),
            options,
            providers=["CPUExecutionProvider"],
        )
    )
    input_shape = [3, args.size, args.size]
    max_batch = max(int(b) for b in args.batch_sizes.split(","))
    for precision, folder in (("fp32", model_dir), ("bf16", model_dir), ("int8", int8_dir)):
        settings = InferenceConfig(cpu_precision=precision)
        calls = predictor.predictor_settings(
            settings, "cpu", input_shape, 64, quantized=precision == "int8"
        )
        runners[f"paddle {precision}"] = predictor.Classifier(folder, calls, input_shape)
        openvino = OpenVinoClassifier(
            folder, settings, input_shape, max_batch, quantized=precision == "int8"
        )
        print(f"openvino {precision}: {openvino.describe()}", flush=True)
        runners[f"openvino {precision}"] = openvino

    rng = np.random.default_rng(0)
    rounds = []
    for repeat in range(args.repeats):
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            batch = rng.standard_normal((batch_size, 3, args.size, args.size)).astype(np.float32)
            for name, run in runners.items():
                first = time.perf_counter()
                run(batch)
                steps = args.steps or max(3, int(8 / max(time.perf_counter() - first, 1e-3)))
                row = latency_summary(
                    batch_size, time_steps(lambda: run(batch), args.warmup, steps)
                )
                rounds.append(dict(row, runtime=name, steps=steps, repeat=repeat))
                print(
                    f"round {repeat + 1} {name:18s} batch {batch_size:3d}: {row['ips']:7.1f} img/s, "
                    f"p50 {row['latency_p50']:.1f} ms",
                    flush=True,
                )
    results = []
    for batch_size in sorted({r["batch_size"] for r in rounds}):
        for name in runners:
            runs = [r for r in rounds if r["runtime"] == name and r["batch_size"] == batch_size]
            results.append(
                {
                    "runtime": name,
                    "batch_size": batch_size,
                    "ips": float(np.median([r["ips"] for r in runs])),
                    "ips_runs": [round(r["ips"], 1) for r in runs],
                    "latency_p50": float(np.median([r["latency_p50"] for r in runs])),
                }
            )
    ratios = {}
    for batch_size in sorted({r["batch_size"] for r in results}):
        by_name = {r["runtime"]: r["ips"] for r in results if r["batch_size"] == batch_size}
        for precision in ("fp32", "bf16", "int8"):
            ours = max(by_name[f"{backend} {precision}"] for backend in ("paddle", "openvino"))
            peers = [ips for name, ips in by_name.items() if name.endswith(precision)]
            ratios[f"best toolkit backend / fastest runtime, {precision}, batch {batch_size}"] = (
                ours / max(peers)
            )
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(
            {
                "arch": args.arch,
                "size": args.size,
                "threads": threads,
                "paddle": paddle.__version__,
                "onnxruntime": onnxruntime.__version__,
                "repeats": args.repeats,
                "results": results,
                "rounds": rounds,
                "ratios": ratios,
            },
            handle,
            indent=1,
        )


if __name__ == "__main__":
    main()
