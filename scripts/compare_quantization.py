"""Post-training quantization of a trained checkpoint with each algorithm: top-1, top-1
agreement with fp32 and speed, over a whole validation tree; and the same models
exported to ONNX, run by onnxruntime.

    .venv/bin/python scripts/compare_quantization.py output/demo/resnet18 demo_data/fashion_mnist_demo
    # a 2:4 model: its PTQ exports, its QAT checkpoint, the dense model for reference
    .venv/bin/python scripts/compare_quantization.py output/demo_asp/resnet18 \
        demo_data/fashion_mnist_demo --qat-checkpoint output/demo_sparse_qat/resnet18 \
        --dense-checkpoint output/demo/resnet18 --output benchmarks/sparse_int8_resnet18_demo.json

Exports the checkpoint in fp32 and once per algorithm with --ptq-algo (the same
calibration images each time), and the QAT checkpoint if given, runs every model
through oneDNN on the CPU on all validation images, prints a table and writes --output
(JSON). A 2:4 checkpoint's exports are checked to hold the pattern (every pruned
weight, in the Paddle model and in model.onnx).
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


from paddle_resnet.deploy import inference
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.core import feeds
from paddle_resnet.deploy import model_input
from paddle_resnet.deploy import exported
from paddle_resnet.core.config import PTQ_ALGOS, build_config
from paddle_resnet.data.dali import open_split
from paddle_resnet.core.optional import require
from paddle_resnet.deploy import export as exporting

onnxruntime = require("onnxruntime", "scripts/compare_quantization.py")


def predictions(config, precision, batch_size):
    """Top-1 classes of every validation image by Paddle Inference and by onnxruntime,
    the labels, and Paddle's img/s."""
    config = build_config(
        dict(
            config,
            **{
                "inference.cpu_precision": precision,
                "inference.backend": "cpu",
                "data.batch_size": batch_size,
            },
        )
    )
    classifier, info, _ = inference.build_classifier(config, batch_size)
    batches = list(
        model_input.validation_batches(open_split(config.data, "val"), config.data, info)
    )
    start = time.perf_counter()
    top = [classifier(batch[feeds.IMAGE]).argmax(1) for batch in batches]
    seconds = time.perf_counter() - start
    session = onnxruntime.InferenceSession(
        os.path.join(config.inference.directory, exported.ONNX_FILE),
        providers=["CPUExecutionProvider"],
    )
    name = session.get_inputs()[0].name
    onnx_top = [session.run(None, {name: batch[feeds.IMAGE]})[0].argmax(1) for batch in batches]
    labels = np.concatenate([batch[feeds.LABEL].ravel() for batch in batches])
    return np.concatenate(top), np.concatenate(onnx_top), labels, len(labels) / seconds


def flat(sections):
    return {
        f"{section}.{key}": value
        for section, keys in sections.items()
        for key, value in keys.items()
    }


def pattern_held(model_dir):
    """How many weights of the export are listed as 2:4 and hold it in the Paddle model and
    in model.onnx (None for a dense export); raises if one does not."""
    marked = exported.read_info(model_dir)["sparse_2to4"]
    if not marked:
        return None
    result = subprocess.run(
        [sys.executable, "-m", "paddle_resnet.commands.check_sparsity", model_dir],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"{model_dir}: the export lost the 2:4 pattern\n{result.stdout}")
    return len(marked)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint folder (or an arch folder: the newest)")
    parser.add_argument("image_root")
    parser.add_argument("--algos", default=",".join(PTQ_ALGOS))
    parser.add_argument("--calibration-images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument(
        "--qat-checkpoint",
        help="also export this QAT checkpoint (trained from CHECKPOINT) and run it in int8",
    )
    parser.add_argument(
        "--dense-checkpoint",
        help="a reference row: this fp32 checkpoint (the dense model CHECKPOINT was pruned from)",
    )
    parser.add_argument("--output", default="benchmarks/ptq_resnet18_demo.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as workdir:

        def export(name, checkpoint, **values):
            meta, _ = ckpt.read_checkpoint(checkpoint)
            config = dict(
                flat(meta["config"]),
                **{
                    "run.from_checkpoint": checkpoint,
                    "run.from_pretrained_params": None,
                    "inference.onnx": True,
                    "data.image_root": args.image_root,
                    "inference.model_dir": os.path.join(workdir, name),
                    "inference.export_log_path": os.path.join(workdir, name + ".json"),
                },
                **values,
            )
            start = time.perf_counter()
            exporting.export(build_config(config))
            held = pattern_held(config["inference.model_dir"])
            return config, time.perf_counter() - start, held

        def measure(name, config, precision, seconds, held):
            top, onnx_top, labels, ips = predictions(config, precision, args.batch_size)
            reference = top if not rows else top32
            row = {
                "model": name,
                "top1": float((top == labels).mean()),
                "agreement": float((top == reference).mean()),
                "img_per_s": round(ips, 1),
                "export_seconds": round(seconds, 1),
                "onnx_top1": float((onnx_top == labels).mean()),
                "onnx_agreement": float((onnx_top == reference).mean()),
                "sparse_2to4": held,
            }
            rows.append(row)
            print(row, flush=True)
            return top

        fp32 = export("fp32", args.checkpoint)
        top32 = measure("fp32", fp32[0], "fp32", *fp32[1:])
        for algo in args.algos.split(","):
            ptq = export(
                algo,
                args.checkpoint,
                **{
                    "inference.ptq_algo": algo,
                    "inference.calibration_images": args.calibration_images,
                },
            )
            measure(f"int8 PTQ {algo}", ptq[0], "int8", *ptq[1:])
        if args.qat_checkpoint:
            qat = export("qat", args.qat_checkpoint)
            measure("int8 QAT", qat[0], "int8", *qat[1:])
        if args.dense_checkpoint:
            dense = export("dense", args.dense_checkpoint)
            measure("dense fp32 (reference)", dense[0], "fp32", *dense[1:])

    print(f"{'model':<24} {'top-1':>8} {'agrees':>8} {'img/s':>8} {'ONNX top-1':>11} {'agrees':>8}")
    for row in rows:
        print(
            f"{row['model']:<24} {100 * row['top1']:7.2f}% {100 * row['agreement']:7.2f}% "
            f"{row['img_per_s']:8.1f} {100 * row['onnx_top1']:10.2f}% "
            f"{100 * row['onnx_agreement']:7.2f}%"
        )
    with open(args.output, "w") as handle:
        json.dump(
            {
                "checkpoint": args.checkpoint,
                "qat_checkpoint": args.qat_checkpoint,
                "dense_checkpoint": args.dense_checkpoint,
                "images": int(len(top32)),
                "calibration_images": args.calibration_images,
                "rows": rows,
            },
            handle,
            indent=1,
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
