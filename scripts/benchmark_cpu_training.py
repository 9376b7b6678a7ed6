"""CPU training speed: Paddle static (plain kernels, oneDNN) against PyTorch eager.

    .venv/bin/pip install -r requirements-tools.txt
    .venv/bin/python scripts/benchmark_cpu_training.py --profile

Same architecture (parameter counts checked equal), batch, resolution, threads and
random data for every contender. Each run is a fresh process; the contenders run
in ABBA order (plain, oneDNN, PyTorch, PyTorch, oneDNN, plain) and each gets the
mean of its two runs, so drift of a shared machine falls on all alike. With
``--profile`` the Paddle variants run once more under Paddle's profiler and the
share of each op type in the step is recorded. Writes a table and --output (JSON).
"""

import paddle_resnet  # noqa: F401,I001  (first: sets the process environment before Paddle loads)

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import paddle
import paddle.profiler as profiler

from paddle_resnet.core.errors import exit_status
from paddle_resnet.core import feeds
from paddle_resnet.training import prepare
from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import build_config
from paddle_resnet.core.metrics import latency_summary, time_steps
from paddle_resnet.core.optional import require

SETTINGS = "resnet50:224:16,resnet18:32:64,resnet50:32:64"
# name -> (model.data_layout, run.cpu_onednn) for the Paddle contenders
PADDLE_VARIANTS = {"paddle_plain": ("NCHW", False), "paddle_onednn": ("NCHW", True)}
ORDER = ("paddle_plain", "paddle_onednn", "torch", "torch", "paddle_onednn", "paddle_plain")


def classes_for(size):
    """ImageNet's 1,000 classes at ImageNet sizes; the demo's 10 at its 32 px."""
    return 1000 if size >= 128 else 10


def paddle_trainer(variant, arch, size, batch):
    """(one training step as a function, trainable parameter count) for a Paddle variant."""
    layout, onednn = PADDLE_VARIANTS[variant]
    config = build_config(
        {
            "model.arch": arch,
            "model.num_classes": classes_for(size),
            "data.crop_size": size,
            "data.batch_size": batch,
            "model.data_layout": layout,
            "run.cpu_onednn": onednn,
        }
    )
    # the programs a training run of this config prepares, one process
    programs, exe = prepare.ready_for_weights(config, True, 1, 1000, paddle.CPUPlace())
    rng = np.random.default_rng(0)
    shape = [batch, 3, size, size] if layout == "NCHW" else [batch, size, size, 3]
    feed = {
        feeds.IMAGE: rng.standard_normal(shape).astype("float32"),
        feeds.LABEL: rng.integers(0, classes_for(size), (batch, 1)).astype("int64"),
    }
    loss = programs.train_fetches["loss"]
    count = sum(int(np.prod(p.shape)) for p in programs.train.all_parameters() if p.trainable)
    return (lambda: exe.run(programs.train, feed=feed, fetch_list=[loss])), count


def torch_trainer(arch, size, batch):
    """(one eager training step, trainable parameter count): ResNet v1.5, SGD momentum."""
    torch = require("torch", "the PyTorch peer of this benchmark")
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model = torch_resnet(torch, arch, classes_for(size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, classes_for(size), (batch,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels, label_smoothing=0.1).backward()
        optimizer.step()

    return step, sum(p.numel() for p in model.parameters() if p.requires_grad)


def torch_resnet(torch, arch, num_classes):
    """ResNet v1.5 (stride on the 3x3) in PyTorch, as torchvision defines it; written
    out because torchvision's CPU wheel is not on PyPI. Parameter counts are checked
    against the Paddle model's."""
    nn = torch.nn
    depths = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet50": ("bottleneck", [3, 4, 6, 3])}
    kind, blocks = depths[arch]
    expansion = 4 if kind == "bottleneck" else 1

    def conv_bn(cin, cout, k, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
        return layers + [nn.ReLU(inplace=True)] if relu else layers

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * expansion
            if kind == "bottleneck":
                body = (
                    conv_bn(cin, width, 1)
                    + conv_bn(width, width, 3, stride)
                    + conv_bn(width, cout, 1, relu=False)
                )
            else:
                body = conv_bn(cin, width, 3, stride) + conv_bn(width, cout, 3, relu=False)
            self.body = nn.Sequential(*body)
            self.shortcut = (
                nn.Sequential(*conv_bn(cin, cout, 1, stride, relu=False))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    layers, cin = conv_bn(3, 64, 7, 2) + [nn.MaxPool2d(3, 2, 1)], 64
    for stage, count in enumerate(blocks):
        width = 64 * 2**stage
        for index in range(count):
            layers.append(Block(cin, width, 2 if index == 0 and stage > 0 else 1))
            cin = width * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def op_shares(step, steps):
    """Share of each op type in the profiled steps' operator time, largest first."""
    with tempfile.TemporaryDirectory() as trace_dir:
        prof = profiler.Profiler(
            targets=[profiler.ProfilerTarget.CPU],
            on_trace_ready=profiler.export_chrome_tracing(trace_dir),
        )
        prof.start()
        for _ in range(steps):
            step()
            prof.step()
        prof.stop()
        events = json.load(open(glob.glob(os.path.join(trace_dir, "*.json"))[0]))["traceEvents"]
    totals = collections.Counter()
    for event in events:
        if event.get("cat") == "Operator":
            totals[event["name"].split("[")[0]] += event["dur"]
    whole = sum(totals.values())
    return {name: round(us / whole, 4) for name, us in totals.most_common(10)}


def worker(args):
    """One contender in this process; prints its result as one JSON line."""
    arch, size, batch = args.setting
    if args.worker == "torch":
        step, params = torch_trainer(arch, size, batch)
    else:
        step, params = paddle_trainer(args.worker, arch, size, batch)
    if args.profile:
        step()
        print(json.dumps({"op_shares": op_shares(step, 2)}))
        return
    seconds = time_steps(step, args.warmup, args.steps)
    print(json.dumps({"ips": latency_summary(batch, seconds)["ips"], "parameters": params}))


def run_worker(name, setting, args, profile=False):
    command = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--setting",
        ":".join(map(str, setting)),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    out = subprocess.run(
        command + (["--profile"] if profile else []), capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def parse_setting(text):
    arch, size, batch = text.split(":")
    return arch, int(size), int(batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", default=SETTINGS, help="arch:size:batch,...")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="record Paddle's op shares")
    parser.add_argument("--output", default="benchmarks/cpu_training.json")
    parser.add_argument("--worker", choices=[*PADDLE_VARIANTS, "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--setting", type=parse_setting, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    require("torch", "the PyTorch peer of this benchmark")
    results = []
    for setting in map(parse_setting, args.settings.split(",")):
        runs = collections.defaultdict(list)
        for name in ORDER:
            result = run_worker(name, setting, args)
            runs[name].append(result["ips"])
            runs[name + "_parameters"] = result["parameters"]
        if len({runs[name + "_parameters"] for name in ORDER}) != 1:
            raise SystemExit(f"parameter counts differ: {dict(runs)}")
        arch, size, batch = setting
        row = {"arch": arch, "size": size, "batch": batch, "parameters": runs["torch_parameters"]}
        for name in dict.fromkeys(ORDER):
            row[name + "_ips_runs"] = [round(ips, 2) for ips in runs[name]]
            row[name + "_ips"] = round(float(np.mean(runs[name])), 2)
        row["onednn_vs_plain"] = round(row["paddle_onednn_ips"] / row["paddle_plain_ips"], 3)
        row["onednn_vs_torch"] = round(row["paddle_onednn_ips"] / row["torch_ips"], 3)
        if args.profile:
            row["op_shares"] = {
                name: run_worker(name, setting, args, profile=True)["op_shares"]
                for name in PADDLE_VARIANTS
            }
        results.append(row)
        print(
            f"{arch} {size}px batch {batch}: plain {row['paddle_plain_ips']} img/s, "
            f"oneDNN {row['paddle_onednn_ips']}, PyTorch {row['torch_ips']} -> oneDNN "
            f"{row['onednn_vs_plain']}x plain, {row['onednn_vs_torch']}x PyTorch",
            flush=True,
        )
    record = {
        "threads": available_cores(),
        "paddle": paddle.__version__,
        "torch": require("torch", "").__version__,
        "order": ORDER,
        "steps": args.steps,
        "warmup": args.warmup,
        "results": results,
    }
    with open(args.output, "w") as out:
        json.dump(record, out, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
