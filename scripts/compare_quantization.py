"""Post-training quantization of a trained checkpoint with each algorithm: top-1, top-1
agreement with fp32 and speed, over a whole validation tree; and the same models
exported to ONNX, run by onnxruntime.

    .venv/bin/python scripts/compare_quantization.py output/demo/resnet18 demo_data/fashion_mnist_demo

Exports the checkpoint in fp32 and once per algorithm with --ptq-algo (the same
calibration images each time), runs every model through oneDNN on the CPU on all
validation images, prints a table and writes --output (JSON).
"""
import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import argparse
import json
import os
import tempfile
import time

import numpy as np

import export_model
import inference
from paddle_resnet import checkpoint as ckpt
from paddle_resnet import exported
from paddle_resnet.config import PTQ_ALGOS, build_config
from paddle_resnet.data.dali import open_split
from paddle_resnet.optional import require

onnxruntime = require("onnxruntime", "scripts/compare_quantization.py")


def predictions(config, precision, batch_size):
    """Top-1 classes of every validation image by Paddle Inference and by onnxruntime,
    the labels, and Paddle's img/s."""
    config = build_config(dict(config, **{"inference.cpu_precision": precision,
                                          "inference.backend": "cpu",
                                          "data.batch_size": batch_size}))
    classifier, info, _ = inference.build_classifier(config, batch_size)
    batches = list(exported.validation_batches(open_split(config.data, "val"), config.data, info))
    start = time.perf_counter()
    top = [classifier(batch["data"]).argmax(1) for batch in batches]
    seconds = time.perf_counter() - start
    session = onnxruntime.InferenceSession(
        os.path.join(config.inference.directory, exported.ONNX_FILE),
        providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    onnx_top = [session.run(None, {name: batch["data"]})[0].argmax(1) for batch in batches]
    labels = np.concatenate([batch["label"].ravel() for batch in batches])
    return np.concatenate(top), np.concatenate(onnx_top), labels, len(labels) / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint folder (or an arch folder: the newest)")
    parser.add_argument("image_root")
    parser.add_argument("--algos", default=",".join(PTQ_ALGOS))
    parser.add_argument("--calibration-images", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--output", default="benchmarks/ptq_resnet18_demo.json")
    args = parser.parse_args()
    meta, _ = ckpt.read_checkpoint(args.checkpoint)
    trained = {f"{section}.{key}": value for section, keys in meta["config"].items()
               for key, value in keys.items()}
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        def export(name, **values):
            config = dict(trained, **{"run.from_checkpoint": args.checkpoint, "inference.onnx": True,
                                      "data.image_root": args.image_root,
                                      "inference.model_dir": os.path.join(workdir, name),
                                      "inference.export_log_path": os.path.join(workdir, name + ".json")},
                          **values)
            start = time.perf_counter()
            export_model.export(build_config(config))
            return config, time.perf_counter() - start

        fp32_config, _ = export("fp32")
        top32, onnx32, labels, fp32_ips = predictions(fp32_config, "fp32", args.batch_size)
        rows.append({"model": "fp32", "top1": float((top32 == labels).mean()), "agreement": 1.0,
                     "img_per_s": round(fp32_ips, 1),
                     "onnx_top1": float((onnx32 == labels).mean()),
                     "onnx_agreement": float((onnx32 == top32).mean())})
        for algo in args.algos.split(","):
            config, seconds = export(algo, **{"inference.ptq_algo": algo,
                                              "inference.calibration_images": args.calibration_images})
            top8, onnx8, labels8, ips = predictions(config, "int8", args.batch_size)
            assert (labels8 == labels).all()
            rows.append({"model": f"int8 PTQ {algo}", "top1": float((top8 == labels).mean()),
                         "agreement": float((top8 == top32).mean()), "img_per_s": round(ips, 1),
                         "export_seconds": round(seconds, 1),
                         "onnx_top1": float((onnx8 == labels).mean()),
                         "onnx_agreement": float((onnx8 == top32).mean())})
            print(rows[-1], flush=True)
    print(f"{'model':<18} {'top-1':>8} {'agrees':>8} {'img/s':>8} {'ONNX top-1':>11} {'agrees':>8}")
    for row in rows:
        print(f"{row['model']:<18} {100 * row['top1']:7.2f}% {100 * row['agreement']:7.2f}% "
              f"{row['img_per_s']:8.1f} {100 * row['onnx_top1']:10.2f}% "
              f"{100 * row['onnx_agreement']:7.2f}%")
    with open(args.output, "w") as handle:
        json.dump({"checkpoint": args.checkpoint, "images": int(len(labels)),
                   "calibration_images": args.calibration_images, "rows": rows}, handle, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
