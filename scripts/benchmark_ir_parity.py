"""The two IRs side by side on Paddle 3.x: the same seed, data and model, built on the
legacy IR and on PIR (``--ir``), in one run.

    .venv-paddle3/bin/python scripts/benchmark_ir_parity.py \\
        --image-root demo_data/fashion_mnist_demo --output benchmarks/ir_parity_resnet18_demo.json
    # ImageNet's crop size, dense only (the IR choice of ``training/ir.py``)
    .venv-paddle3/bin/python scripts/benchmark_ir_parity.py --image-root demo_data/fashion_mnist_demo \\
        --arch resnet50 --crop-size 224 --batch-size 16 --steps 6 --no-asp \\
        --output benchmarks/ir_parity_resnet50_224.json

1. Per-step losses of ``--steps`` training steps from the same initialisation and the
   same batches (DALI, seeded), dense and with 2:4 sparsity (pruned at step 0), both on
   Paddle's plain CPU kernels, and each IR also with oneDNN convolutions (the legacy
   IR's default at small crops; PIR's with --cpu-onednn); dense also PIR with bf16 AMP
   (CPUs with bf16 only); each variant in a fresh process.
2. Training and evaluation img/s of each, and their ratio PIR / legacy.
3. With ``--demo-epochs N``: the demo recipe (configs/resnet18_demo.yaml) trained N
   epochs on each IR; top-1 of each.
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

import paddle

from paddle_resnet.commands import train
from paddle_resnet.core import paddle_internals
from paddle_resnet.core.config import build_config, read_recipe, resolve_config_path
from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.report import read_report
from paddle_resnet.data.folder import linked_subset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "legacy plain": {"run.ir": "legacy", "run.cpu_onednn": False},
    "legacy oneDNN": {"run.ir": "legacy", "run.cpu_onednn": True},
    "pir": {"run.ir": "pir"},
    # PIR's convolutions and ReLUs moved to its oneDNN dialect (onednn.py)
    "pir oneDNN": {"run.ir": "pir", "run.cpu_onednn": True},
    # the one AMP a CPU can train on PIR (O1; fp16 and O2 need the GPU build)
    "pir bf16 AMP": {"run.ir": "pir", "amp.enabled": True, "amp.dtype": "bfloat16"},
}


def recipe(args, output_dir, **values):
    base = read_recipe(resolve_config_path("resnet18_demo"))
    base.update(
        {
            "data.image_root": args.image_root,
            "run.output_dir": output_dir,
            "run.print_interval": 1,
            "data.num_threads": 2,
            "model.arch": args.arch,
            "data.crop_size": args.crop_size,
            "data.resize_short": args.crop_size,
            "data.batch_size": args.batch_size,
        }
    )
    base.update(values)
    return build_config(base)


def steps_run(args, name, sparse, scratch):
    """One variant's losses over ``args.steps`` steps and its train / eval img/s, in a
    fresh process (this script again, with --one)."""
    out = tempfile.mkdtemp(dir=scratch)
    command = [sys.executable, __file__, "--one", name, "--image-root", args.image_root]
    command += ["--steps", str(args.steps), "--scratch", out] + (["--sparse"] if sparse else [])
    command += ["--arch", args.arch, "--crop-size", str(args.crop_size)]
    command += ["--batch-size", str(args.batch_size)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{name}: {result.stderr.strip().splitlines()[-1]}")
    with open(os.path.join(out, "result.json")) as handle:
        return json.load(handle)


def one(args):
    """The --one child: a train_only run of ``--steps`` steps, then an eval_only pass."""
    values = dict(VARIANTS[args.one], **{"run.epochs": 1, "run.run_scope": "train_only"})
    if args.sparse:
        values.update({"asp.enabled": True, "asp.prune_model": True})
    config = recipe(args, os.path.join(args.scratch, "train"), **values)
    # a whole epoch is 547 steps of 64: cut it by the training images the run may see
    config = build_config(
        dict(config.flat(), **{"data.image_root": steps_tree(args, config.data.batch_size)})
    )
    metrics = train.run(config, report_stream=open(os.devnull, "w"))
    losses = [r["data"]["loss"] for r in read_report(config.report_file) if r["type"] == "LOG"]
    evaluated = recipe(
        args,
        os.path.join(args.scratch, "eval"),
        **dict(
            VARIANTS[args.one],
            **{
                "run.run_scope": "eval_only",
                "run.from_checkpoint": os.path.join(args.scratch, "train", args.arch, "1"),
            },
        ),
    )
    val = train.run(evaluated, report_stream=open(os.devnull, "w"))
    result = {
        "losses": losses,
        "train_ips": metrics["run.train.images"] / metrics["run.train.seconds"],
        "eval_ips": val["val.images"] / val["val.seconds"],
    }
    with open(os.path.join(args.scratch, "result.json"), "w") as handle:
        json.dump(result, handle)


def steps_tree(args, batch):
    """The image tree whose epoch is ``--steps`` steps (and all validation images)."""
    return linked_subset(args.image_root, os.path.join(args.scratch, "tree"), args.steps * batch)


def demo(args, name, scratch):
    config = recipe(args, tempfile.mkdtemp(dir=scratch), **VARIANTS[name])
    config = build_config(dict(config.flat(), **{"run.epochs": args.demo_epochs}))
    metrics = train.run(config, report_stream=open(os.devnull, "w"))
    return {
        "top1": metrics["val.top1"],
        "train_ips": metrics["run.train.images"] / metrics["run.train.seconds"],
    }


def largest_difference(run, other):
    return max(abs(a - b) for a, b in zip(run["losses"], other["losses"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-root", required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--arch", default="resnet18")
    parser.add_argument("--crop-size", type=int, default=32, help="32: the demo's")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-asp", action="store_true", help="dense runs only")
    parser.add_argument("--demo-epochs", type=int, default=0)
    parser.add_argument("--output")
    parser.add_argument("--one", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--sparse", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(args)
    if not paddle_internals.PADDLE3:
        sys.exit("the two IRs exist on Paddle 3.x only: run this with .venv-paddle3")
    # bf16 AMP needs a CPU with bf16 (devices.check_training_options refuses it elsewhere)
    variants = [n for n in VARIANTS if "bf16" not in n or paddle_internals.supports_bf16()]
    kinds = ("dense",) if args.no_asp else ("dense", "asp")
    result = {
        "paddle": paddle.__version__,
        "arch": args.arch,
        "crop_size": args.crop_size,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "skipped": sorted(set(VARIANTS) - set(variants)),
        **{kind: {} for kind in kinds},
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name in variants:
            result["dense"][name] = steps_run(args, name, False, scratch)
            print(name, "dense", {k: v for k, v in result["dense"][name].items() if k != "losses"})
        for name in ("legacy plain", "pir") if "asp" in kinds else ():
            result["asp"][name] = steps_run(args, name, True, scratch)
            print(name, "asp", {k: v for k, v in result["asp"][name].items() if k != "losses"})
        for kind in kinds:
            result[kind]["largest_loss_difference"] = largest_difference(
                result[kind]["legacy plain"], result[kind]["pir"]
            )
        dense = result["dense"]
        if "pir bf16 AMP" in dense:
            dense["largest_loss_difference bf16 AMP to fp32"] = largest_difference(
                dense["pir"], dense["pir bf16 AMP"]
            )
        result["ratios"] = {
            f"train_ips {a} / {b}": dense[a]["train_ips"] / dense[b]["train_ips"]
            for a, b in (
                ("pir", "legacy plain"),
                ("pir", "legacy oneDNN"),
                ("pir oneDNN", "legacy oneDNN"),
                ("pir oneDNN", "pir"),
                ("pir bf16 AMP", "pir"),
                ("pir bf16 AMP", "legacy oneDNN"),
            )
            if a in dense and b in dense
        }
        result["ratios"]["eval_ips pir / legacy plain"] = (
            dense["pir"]["eval_ips"] / dense["legacy plain"]["eval_ips"]
        )
        if args.demo_epochs:
            demo_variants = [
                n for n in ("legacy oneDNN", "pir", "pir oneDNN", "pir bf16 AMP") if n in variants
            ]
            result["demo"] = {name: demo(args, name, scratch) for name in demo_variants}
    print(json.dumps({k: v for k, v in result.items() if k in ("ratios", "demo")}, indent=1))
    print("largest loss difference:", [result[kind]["largest_loss_difference"] for kind in kinds])
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    sys.exit(exit_status(main))
