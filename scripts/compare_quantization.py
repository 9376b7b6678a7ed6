"""Post-training quantization of a trained checkpoint with each algorithm: top-1, top-1
agreement with fp32 and speed, over a whole validation tree, in Paddle Inference (oneDNN),
onnxruntime (the export's model.onnx) and OpenVINO; optionally against OpenVINO's own
int8 (NNCF) of the same fp32 model.

    .venv/bin/python scripts/compare_quantization.py output/demo/resnet18 demo_data/fashion_mnist_demo
    # a 2:4 model: its PTQ exports, its QAT checkpoint, the dense model for reference
    .venv/bin/python scripts/compare_quantization.py output/demo_asp/resnet18 \
        demo_data/fashion_mnist_demo --qat-checkpoint output/demo_sparse_qat/resnet18 \
        --dense-checkpoint output/demo/resnet18 --output benchmarks/sparse_int8_resnet18_demo.json
    # on Paddle 3, from PIR: the toolkit's own calibration and int8 model.onnx
    .venv-paddle3/bin/python scripts/compare_quantization.py output/demo/resnet18 \
        demo_data/fashion_mnist_demo --ir pir --algos hist,abs_max --nncf performance \
        --output benchmarks/int8_pir_resnet18_demo.json
    # the toolkit's int8 (PTQ, QAT) against NNCF's, all through OpenVINO (scripts/setup_nncf.sh)
    .venv/bin/python scripts/compare_quantization.py output/demo/resnet18 demo_data/fashion_mnist_demo \
        --algos hist,abs_max --qat-checkpoint output/demo_qat/resnet18 --nncf performance,mixed \
        --output benchmarks/int8_engines_resnet18_demo.json

Exports the checkpoint in fp32 and once per algorithm with --ptq-algo (the same
calibration images each time), and the QAT checkpoint if given, runs every model
through each runtime on the CPU on all validation images (NNCF's only through
OpenVINO), prints a table and writes --output (JSON). Each row also holds, per runtime,
its balanced top-1 and the classes that lost most against the dense fp32 model (the
--dense-checkpoint, else this checkpoint's fp32 export), with their counts. A 2:4 checkpoint's exports are
checked to hold the pattern (every pruned weight, in the Paddle model and in
model.onnx).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import paddle

from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.core.config.keys import IRS, PTQ_ALGOS
from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.metrics import (
    class_changes,
    class_results,
    confusion_counts,
    describe_class_changes,
)
from paddle_resnet.core.optional import require
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import dali_input, exported, inference_modes, nncf_int8
from paddle_resnet.deploy import export as exporting
from paddle_resnet.training import checkpoint as ckpt

DENSE = "dense fp32 (reference)"
# the runtimes every export runs in: key prefix in the rows -> (inference.py's backend, title)
RUNTIMES = {
    "": ("cpu", "oneDNN"),
    "onnx_": ("onnxruntime", "ONNX"),
    "openvino_": ("openvino", "OpenVINO"),
}


def predictions(config, precision, batch_size):
    """Top-1 classes of every validation image by each of RUNTIMES (by key), the labels,
    and Paddle Inference's img/s."""
    values = dict(config, **{"data.batch_size": batch_size})
    model = build_config(values)
    batches = validation_batches(model, exported.read_info(model.inference.directory))
    # a PIR export's Paddle program is fp32 (PTQ) or simulates its quantization (QAT):
    # Paddle Inference runs it in fp32, its int8 is model.onnx's
    pir = exported.is_pir_export(model.inference.directory)
    tops = {}
    for key, (backend, _) in RUNTIMES.items():
        model_precision = backend == "onnxruntime" or (backend == "cpu" and pir)
        backend_config = build_config(
            dict(
                values,
                **{
                    # onnxruntime runs the model's own precision and takes no flag for it
                    "inference.cpu_precision": "fp32" if model_precision else precision,
                    "inference.backend": backend,
                },
            )
        )
        classifier, _, _ = inference_modes.build_classifier(backend_config, batch_size)
        start = time.perf_counter()
        tops[key] = np.concatenate([classifier(batch[feeds.IMAGE]).argmax(1) for batch in batches])
        if backend == "cpu":
            ips = len(tops[key]) / (time.perf_counter() - start)
    labels = np.concatenate([batch[feeds.LABEL].ravel() for batch in batches])
    return tops, labels, ips


def validation_batches(config, info):
    return list(dali_input.validation_batches(open_split(config.data, "val"), config.data, info))


def scored(key, top, labels, reference):
    """A row's top-1 and agreement with ``reference`` for the runtime of ``key``."""
    return {
        key + "top1": float((top == labels).mean()),
        key + "agreement": float((top == reference).mean()),
    }


def per_class(top, labels, classes):
    """``metrics.class_results`` of top-1 predictions ``top``."""
    return class_results(confusion_counts(top[:, None], labels, len(classes)), classes)


def class_costs(rows, tops, labels, classes, reference):
    """Each row's classes that lost most against ``reference`` (the dense fp32 model's
    top-1 predictions), per runtime: ``<runtime>lost_most``, and its balanced top-1."""
    dense = per_class(reference, labels, classes)
    for row in rows:
        for key, top in tops[row["model"]].items():
            result = per_class(top, labels, classes)
            row[key + "balanced_top1"] = result["balanced_top1"]
            row[key + "lost_most"] = class_changes(dense, result)
        runtime = "" if "" in tops[row["model"]] else "openvino_"
        print(f"{row['model']}: {describe_class_changes(row[runtime + 'lost_most'])}")


def nncf_predictions(fp32_config, preset, site):
    """Top-1 classes of every validation image by OpenVINO's own int8 of the fp32 export
    (NNCF with ``preset``, calibrated on the images the PTQ exports were)."""
    ov = require("openvino", "--nncf")
    config = build_config(fp32_config)
    info = exported.read_info(config.inference.directory)
    calibration = [batch[feeds.IMAGE] for batch in exporting.calibration_batches(config, info)]
    onnx_path = os.path.join(config.inference.directory, exported.ONNX_FILE)
    # beside the fp32 export (in the script's scratch folder), not inside it
    folder = os.path.dirname(os.path.abspath(config.inference.directory))
    quantized = os.path.join(folder, f"nncf_{preset}.xml")
    model = nncf_int8.quantize(site, onnx_path, calibration, preset, quantized)
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return np.concatenate(
        [compiled(batch[feeds.IMAGE])[0].argmax(1) for batch in validation_batches(config, info)]
    )


def flat(sections):
    return {
        f"{section}.{key}": value
        for section, keys in sections.items()
        for key, value in keys.items()
    }


def pattern_held(model_dir):
    """How many weights of the export are listed as sparse and hold their pattern (2:4) in
    the Paddle model and in model.onnx (None for a dense export); raises if one does not."""
    sparsity = exported.sparsity(exported.read_info(model_dir))
    if not sparsity:
        return None
    result = subprocess.run(
        [sys.executable, "-m", "paddle_resnet.commands.check_sparsity", model_dir],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(
            f"{model_dir}: the export lost the {sparsity['pattern']} pattern\n{result.stdout}"
        )
    return len(sparsity["weights"])


def versions(args):
    """The packages the figures came from."""
    found = {"paddle": paddle.__version__}
    for module in ("onnxruntime", "openvino", "paddle2onnx"):
        found[module] = require(module, "scripts/compare_quantization.py").__version__
    if args.nncf:
        found["nncf"] = nncf_int8.version(args.nncf_site, "--nncf")
    return found


def print_table(rows):
    columns = [(f"{title} top-1", key + "top1") for key, (_, title) in RUNTIMES.items()]
    print(f"{'model':<36}" + "".join(f" {title:>16} {'agrees':>8}" for title, _ in columns))
    for row in rows:
        cells = ""
        for title, key in columns:
            agreement = key.replace("top1", "agreement")
            if key in row:
                cells += f" {100 * row[key]:15.2f}% {100 * row[agreement]:7.2f}%"
            else:
                cells += f" {'-':>16} {'-':>8}"
        print(f"{row['model']:<36}{cells}")


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
    parser.add_argument(
        "--nncf",
        default=[],
        type=lambda text: text.split(","),
        help="also OpenVINO's own int8 of the fp32 export with these NNCF presets "
        f"({', '.join(nncf_int8.PRESETS)}; scripts/setup_nncf.sh), on the same "
        "calibration images",
    )
    parser.add_argument("--nncf-site", default=nncf_int8.DEFAULT_SITE)
    parser.add_argument(
        "--ir", choices=IRS, help="the IR to export from (pir: the toolkit's own int8 model.onnx)"
    )
    parser.add_argument("--output", default="benchmarks/ptq_resnet18_demo.json")
    args = parser.parse_args()
    rows, tops_by_model = [], {}
    with tempfile.TemporaryDirectory() as workdir:

        def export(name, checkpoint, **values):
            meta, _ = ckpt.read_checkpoint(checkpoint)
            config = dict(
                flat(meta["config"]),
                **{
                    "run.from_checkpoint": checkpoint,
                    "run.from_pretrained_params": None,
                    "inference.onnx": True,
                    "run.ir": args.ir,
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
            tops, labels, ips = predictions(config, precision, args.batch_size)
            reference = tops[""] if not rows else top32
            row = {"model": name}
            for key in RUNTIMES:
                row.update(scored(key, tops[key], labels, reference))
            row.update(img_per_s=round(ips, 1), export_seconds=round(seconds, 1), sparse_2to4=held)
            rows.append(row)
            tops_by_model[name] = tops
            print(row, flush=True)
            return tops[""], labels

        fp32 = export("fp32", args.checkpoint)
        top32, labels = measure("fp32", fp32[0], "fp32", *fp32[1:])
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
        for preset in args.nncf:
            # OpenVINO's own int8 runs in OpenVINO only
            top = nncf_predictions(fp32[0], preset, args.nncf_site)
            row = {"model": f"int8 NNCF {preset} (OpenVINO's own)"}
            row.update(scored("openvino_", top, labels, top32))
            rows.append(row)
            tops_by_model[row["model"]] = {"openvino_": top}
            print(row, flush=True)
        if args.dense_checkpoint:
            dense = export("dense", args.dense_checkpoint)
            measure(DENSE, dense[0], "fp32", *dense[1:])
        classes = exported.read_classes(fp32[0]["inference.model_dir"])
        reference = tops_by_model[DENSE if args.dense_checkpoint else "fp32"][""]
        class_costs(rows, tops_by_model, labels, classes, reference)

    print_table(rows)
    with open(args.output, "w") as handle:
        json.dump(
            {
                "checkpoint": args.checkpoint,
                "qat_checkpoint": args.qat_checkpoint,
                "dense_checkpoint": args.dense_checkpoint,
                "images": int(len(top32)),
                "calibration_images": args.calibration_images,
                "ir": args.ir,
                "versions": versions(args),
                "rows": rows,
            },
            handle,
            indent=1,
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
