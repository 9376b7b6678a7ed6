"""Long tails measured on cuts nobody tuned: the plain loss, --class-weights balanced,
deferred weights, the logit-adjusted loss and class-balanced sampling, trained on
unbalanced cuts of two real data sets made by one rule, with several seeds; balanced
top-1 (mean and spread), rare- and common-class accuracy.

    nice -n 19 .venv/bin/python scripts/benchmark_imbalance.py \\
        --output benchmarks/imbalance_cuts.json --work-dir demo_data/imbalance
    .venv/bin/python scripts/benchmark_imbalance.py --output benchmarks/imbalance_cuts.json --table

The cuts (``scripts/data/imbalanced_tree.py --rare 3 --ratio R --seed S``): of a data
set's 10 classes, 3 keep 1/R of the images the others keep, the 3 chosen by the seed S,
which seeds the training too (--seed, --dali-random-seed); validation stays balanced.
Data sets: the demo's Fashion-MNIST JPEGs (``--fmnist-per-class`` training and
``--fmnist-val-per-class`` validation images a class) and scikit-learn's UCI digits
(``scripts/data/digits_to_jpeg.py``: 1,438 training, 359 validation images). Each run is
``train.py --config resnet18_demo`` (the demo recipe) in a process of its own, one at a
time; deferred weights start at the last quarter of the epochs (Cao et al. 2019 defer to
the last fifth of theirs). The JSON is rewritten after every run, with the summary, so an
interrupted sweep started again with the same arguments goes on where it stopped.
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import paddle

from paddle_resnet.core import provenance
from paddle_resnet.core.errors import UserError, exit_status
from paddle_resnet.core.report import read_report, validations
from paddle_resnet.data.fashion_mnist import write_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RARE_CLASSES = 3


def deferral_epoch(epochs):
    """The first epoch of the last quarter: where deferred weights start."""
    return epochs - -(-epochs // 4) + 1


def methods(epochs):
    """{method: train.py flags}: the plain loss first (what the others are compared with)."""
    return {
        "plain": [],
        "weights": ["--class-weights", "balanced"],
        "deferred weights": [
            *("--class-weights", "balanced"),
            *("--class-weights-from-epoch", str(deferral_epoch(epochs))),
        ],
        "logit adjustment": ["--logit-adjustment", "1"],
        "balanced sampling": ["--sampling", "class-balanced"],
    }


def source_trees(args):
    """{data set: (its image tree, train.py flags of its recipe)}."""
    fmnist = os.path.join(
        args.work_dir, f"fashion_mnist_{args.fmnist_per_class}_{args.fmnist_val_per_class}"
    )
    write_tree(fmnist, args.fmnist_per_class, args.fmnist_val_per_class)
    digits = os.path.join(args.work_dir, "digits")
    if not os.path.isdir(digits):
        command = [sys.executable, "scripts/data/digits_to_jpeg.py", "--output", digits]
        subprocess.run(command, cwd=ROOT, check=True)
    return {
        "fashion-mnist": (fmnist, ["--epochs", str(args.fmnist_epochs)]),
        "digits": (digits, ["--epochs", str(args.digits_epochs), "--warmup-epochs", "0.5"]),
    }


def cut(args, source, ratio, seed):
    """The cut of ``source`` at ``ratio`` whose rare classes ``seed`` chooses: its folder
    and its rare classes."""
    cut_name = f"{os.path.basename(source)}_{ratio:g}to1_seed{seed}"  # the source's size too
    folder = os.path.join(args.work_dir, "cuts", cut_name)
    if not os.path.isdir(folder):
        command = [sys.executable, "scripts/data/imbalanced_tree.py", source, folder]
        command += ["--ratio", f"{ratio:g}", "--rare", str(RARE_CLASSES), "--seed", str(seed)]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    train = os.path.join(folder, "train")
    counts = {name: len(os.listdir(os.path.join(train, name))) for name in os.listdir(train)}
    return folder, sorted(counts, key=lambda name: (counts[name], name))[:RARE_CLASSES], counts


def train(command):
    """``python train.py *command`` into a scratch folder: its last validation's VAL and
    CLASSES records, the seconds it took and those its epochs trained."""
    with tempfile.TemporaryDirectory(prefix="imbalance_") as scratch:
        argv = [sys.executable, "train.py", *command, "--output-dir", scratch]
        start = time.perf_counter()
        result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"{shlex.join(command)} failed: {last}")
        report = os.path.join(scratch, "report.json")
        _, val, per_class = validations(report)[-1]
        epochs = [r["data"] for r in read_report(report) if r["type"] == "EPOCH"]
    return val, per_class, seconds, sum(epoch["train.seconds"] for epoch in epochs)


def run_record(val, per_class, rare, seconds, command):
    """One run's figures; ``seconds``: (the process's, its epochs' training)."""
    accuracy = dict(zip(per_class["classes"], per_class["accuracy"]))
    common = [name for name in accuracy if name not in rare]
    return {
        "command": shlex.join(["python", "train.py", *command]),
        "top1": val["val.top1"],
        "balanced_top1": per_class["balanced_top1"],
        "rare_classes": rare,
        "rare_accuracy": statistics.mean(accuracy[name] for name in rare),
        "common_accuracy": statistics.mean(accuracy[name] for name in common),
        "accuracy": accuracy,
        "seconds": round(seconds[0], 1),
        "training_seconds": round(seconds[1], 1),
    }


def spread(values):
    return {
        "mean": statistics.mean(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
    }


def summary(document):
    """Per cut (data set and ratio) and method over the seeds: balanced top-1, rare and
    common accuracy, and the change against the plain loss of the same seed; per method
    over every cut and seed: the same figures, and how many (cut, seed) pairs it won
    against the plain loss."""
    runs = document["runs"]
    per_cut, overall = {}, {}
    for key, run in runs.items():
        cut_name, seed, method = key.rsplit("/", 2)
        plain = runs.get(f"{cut_name}/{seed}/plain")
        change = None if plain is None else run["balanced_top1"] - plain["balanced_top1"]
        for entry in (
            per_cut.setdefault(cut_name, {}).setdefault(method, {"runs": [], "changes": []}),
            overall.setdefault(method, {"runs": [], "changes": []}),
        ):
            entry["runs"].append(run)
            if change is not None and method != "plain":
                entry["changes"].append(change)
    for entry in [e for by_method in per_cut.values() for e in by_method.values()] + list(
        overall.values()
    ):
        runs_of, changes = entry.pop("runs"), entry.pop("changes")
        entry["runs"] = len(runs_of)
        for measure in ("balanced_top1", "rare_accuracy", "common_accuracy"):
            entry[measure] = spread([run[measure] for run in runs_of])
        if changes:
            entry["change"] = dict(spread(changes), won=sum(c > 0 for c in changes))
    return {"per_cut": per_cut, "overall": overall}


def write(path, document):
    document["summary"] = summary(document)
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(document, handle, indent=1)
    os.replace(temporary, path)


def percent(value):
    return f"{100 * value:.1f}"


def row(cut_name, method, entry):
    top1 = entry["balanced_top1"]
    won = f"{entry['change']['won']} of {entry['runs']}" if "change" in entry else ""
    return (
        f"| {cut_name} | {method} | {percent(top1['mean'])} % ({percent(top1['min'])}-"
        f"{percent(top1['max'])}) | {percent(entry['rare_accuracy']['mean'])} % | "
        f"{percent(entry['common_accuracy']['mean'])} % | {won} |"
    )


def table(document):
    """The markdown table of docs/measurements.md: per cut and method, then per method over
    every cut: the balanced top-1 mean (lowest-highest over the seeds), rare- and
    common-class accuracy, the seeds where it beat the plain loss."""
    lines = [
        "| cut | method | balanced top-1 (lowest-highest) | rare classes | common classes "
        "| beat plain |",
        "|---|---|---|---|---|---|",
    ]
    summary_of = document["summary"]
    for cut_name, by_method in summary_of["per_cut"].items():
        lines += [row(cut_name, method, entry) for method, entry in by_method.items()]
    lines += [row("all cuts", method, entry) for method, entry in summary_of["overall"].items()]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--work-dir", default="demo_data/imbalance")
    parser.add_argument("--ratios", default="5,20,50")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--datasets", default="fashion-mnist,digits")
    # sized for 2 shared cores: 90 runs of about 4,000 training images each
    parser.add_argument("--fmnist-per-class", type=int, default=200)
    parser.add_argument("--fmnist-val-per-class", type=int, default=100)
    parser.add_argument("--fmnist-epochs", type=int, default=3)
    parser.add_argument("--digits-epochs", type=int, default=4)
    parser.add_argument("--table", action="store_true", help="print the table of --output")
    args = parser.parse_args()
    if args.table:
        with open(args.output) as handle:
            print(table(json.load(handle)))
        return
    trees = source_trees(args)
    document = {"runs": {}}
    if os.path.exists(args.output):
        with open(args.output) as handle:
            document = json.load(handle)
    # what the first start ran; each run records its own commit too
    settings = dict(
        command=shlex.join(["python", os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        code=provenance.code(),
        paddle=paddle.__version__,
        recipe="resnet18_demo",
        methods={
            name: {method: shlex.join(flags) for method, flags in methods(int(recipe[1])).items()}
            for name, (_, recipe) in trees.items()
        },
        rule=f"--rare {RARE_CLASSES} --ratio R --seed S (scripts/data/imbalanced_tree.py); "
        "the training seeded by S too; deferred weights from the last quarter of the epochs",
    )
    for field, value in settings.items():
        document.setdefault(field, value)
    # seed by seed, so that a sweep stopped early holds every cut and method
    for seed in map(int, args.seeds.split(",")):
        for name in args.datasets.split(","):
            source, recipe = trees[name]
            epochs = int(recipe[1])
            for ratio in map(float, args.ratios.split(",")):
                folder, rare, counts = cut(args, source, ratio, seed)
                for method, flags in methods(epochs).items():
                    key = f"{name} {ratio:g}:1/seed {seed}/{method}"
                    if key in document["runs"]:
                        continue
                    command = ["--config", "resnet18_demo", "--image-root", folder, *recipe]
                    command += ["--seed", str(seed), "--dali-random-seed", str(seed), *flags]
                    command += ["--eval-interval", str(epochs), "--save-interval", str(epochs)]
                    val, per_class, *seconds = train(command)
                    record = run_record(val, per_class, rare, seconds, command)
                    record["train_images"] = sum(counts.values())
                    record["commit"] = provenance.code().get("commit")
                    document["runs"][key] = record
                    write(args.output, document)
                    print(
                        f"{key}: balanced top-1 {percent(record['balanced_top1'])} %, rare "
                        f"{percent(record['rare_accuracy'])} %, common "
                        f"{percent(record['common_accuracy'])} % ({seconds[0]:.0f} s, training "
                        f"{seconds[1]:.0f} s)",
                        flush=True,
                    )
    write(args.output, document)
    print(table(document))


if __name__ == "__main__":
    sys.exit(exit_status(main))
