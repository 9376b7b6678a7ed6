"""Validation speed: train.py's evaluation (the in-memory Paddle Inference predictor
the toolkit now uses on the CPU, and the static executor it used before) against
``inference.py --mode accuracy`` on the export of the same checkpoint, over the same
validation images, in one run.

    .venv/bin/python scripts/benchmark_evaluation.py --image-root demo_data/fashion_mnist_demo \\
        --output benchmarks/evaluation_resnet18_demo.json

The checkpoint: the demo recipe trained for ``--train-steps`` steps (speed does not
depend on the weights). Each way runs ``--repeats`` times, interleaved; medians.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import statistics
import sys
import tempfile

import paddle

from paddle_resnet.commands import train
from paddle_resnet.core.config import build_config, read_recipe, resolve_config_path
from paddle_resnet.core.errors import exit_status
from paddle_resnet.data.folder import linked_subset
from paddle_resnet.deploy import export, inference_modes
from paddle_resnet.training import eval_predictor, run_folder


def config(args, output_dir, **values):
    base = read_recipe(resolve_config_path("resnet18_demo"))
    base.update({"data.image_root": args.image_root, "run.output_dir": output_dir})
    base.update(values)
    return build_config(base)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-root", required=True)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output")
    args = parser.parse_args()
    quiet = open(os.devnull, "w")
    with tempfile.TemporaryDirectory() as scratch:
        trained = config(
            args,
            os.path.join(scratch, "train"),
            **{
                "run.epochs": 1,
                "run.run_scope": "train_only",
                "data.image_root": linked_subset(
                    args.image_root, os.path.join(scratch, "tree"), args.train_steps * 64
                ),
            },
        )
        train.run(trained, report_stream=quiet)
        checkpoint = run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 1)
        evaluation = config(
            args,
            os.path.join(scratch, "eval"),
            **{"run.run_scope": "eval_only", "run.from_checkpoint": checkpoint},
        )
        model_dir = os.path.join(scratch, "model")
        export.export(
            config(
                args,
                os.path.join(scratch, "export"),
                **{"run.from_checkpoint": checkpoint, "inference.model_dir": model_dir},
            )
        )
        served = build_config(
            {
                "data.image_root": args.image_root,
                "data.batch_size": evaluation.data.batch_size,
                "inference.model_dir": model_dir,
                "inference.mode": "accuracy",
                "inference.backend": "cpu",
                "inference.log_path": os.path.join(scratch, "inference.json"),
            }
        )
        usable = eval_predictor.usable
        runs = {"train.py predictor": [], "train.py executor": [], "inference.py": []}
        results = {}
        for _ in range(args.repeats):
            for way in runs:
                if way == "inference.py":
                    result = inference_modes.run(served, report_stream=quiet)
                    seconds, top1, loss = result["seconds"], result["top1"], result["loss"]
                else:
                    eval_predictor.usable = (
                        usable if way.endswith("predictor") else lambda *a: False
                    )
                    result = train.run(evaluation, report_stream=quiet)
                    seconds, top1, loss = (
                        result["val.seconds"],
                        result["val.top1"],
                        result["val.loss"],
                    )
                images = result.get("images", result.get("val.images"))
                runs[way].append(images / seconds)
                results[way] = {"top1": top1, "loss": loss}
        eval_predictor.usable = usable
    ips = {way: statistics.median(values) for way, values in runs.items()}
    report = {
        "paddle": paddle.__version__,
        "images": images,
        "batch_size": evaluation.data.batch_size,
        "ips_runs": runs,
        "ips": ips,
        "accuracy": results,
        "ratio_predictor_over_inference": ips["train.py predictor"] / ips["inference.py"],
        "ratio_executor_over_inference": ips["train.py executor"] / ips["inference.py"],
    }
    print(json.dumps(report, indent=1))
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(report, handle, indent=1)


if __name__ == "__main__":
    sys.exit(exit_status(main))
