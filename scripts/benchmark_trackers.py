"""Step-time overhead of the experiment trackers: training steps with the run's report
alone against the report with --tracker tensorboard, mlflow and visualdl at once, in one
process, taking turns in slices (core/interleave.py: the ratio is the median of the
per-round ratios).

    .venv/bin/python scripts/benchmark_trackers.py      # benchmarks/trackers_overhead.json

The steps are the demo's (ResNet-18 at 32 px, batch 64, random images: the shortest
step the toolkit's recipes take, where a tracker's cost shows most), each a
``loop.train_step`` on a train program prepared as a run prepares it, with a LOG record
every ``--print-interval`` steps as ``loop.train_one_epoch`` writes it (10, the default;
the demo logs every 100); after each slice the trackers' writing thread finishes what was
queued (``Trackers.wait``, outside the slice's time) so that no slice pays for the one
before it. Beside the speeds, every thread's CPU time a step takes (``time.process_time``, the
writing thread's included), whose ratio a neighbour's load moves less than the wall
clock's. And, less at the mercy of the load still, the trackers' CPU time from its parts:
what each tracker spends on one LOG record and on one validation (the confusion image
drawn, each class's accuracy), called as the writing thread calls it, and what the step's
thread spends handing a record over, against the CPU time of a step
(``trackers_cpu_share_of_steps_percent``); and how long opening them took (MLflow's local
store is created then). Writes a table and --output (JSON).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

import numpy as np
import paddle

from paddle_resnet.core import bootstrap, devices, feeds, interleave, metrics, trackers
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import exit_status
from paddle_resnet.core.optional import require
from paddle_resnet.core.plots import confusion_picture
from paddle_resnet.core.report import Report
from paddle_resnet.training import cpu_kernels, ir, prepare
from paddle_resnet.training import programs as program
from paddle_resnet.training.loop import train_step
from paddle_resnet.training.onednn import onednn_wanted

ALL = tuple(trackers.TRACKERS)
STEPS_PER_EPOCH = 547  # the demo's: 35,000 images in batches of 64
CLASSES = [f"class_{index}" for index in range(10)]
MODULES = ("tensorboardX", "mlflow", "visualdl", "matplotlib")


def demo_config(batch):
    """The demo's model and input size, its CPU kernels chosen as train.py chooses them."""
    values = {
        "model.arch": "resnet18",
        "model.num_classes": len(CLASSES),
        "data.crop_size": 32,
        "data.resize_short": 32,
        "data.batch_size": batch,
    }
    return cpu_kernels.resolved(build_config(values), world_size=1)[0]


def training_step(config):
    """One step of ``config``'s train program on one random batch: its fetched values."""
    programs, exe = prepare.ready_for_weights(config, True, 1, 1000, paddle.CPUPlace())
    rng = np.random.default_rng(0)
    batch = config.data.batch_size
    feed = {
        feeds.IMAGE: rng.standard_normal([batch, *program.input_shape(config)]).astype("float32"),
        feeds.LABEL: rng.integers(0, len(CLASSES), (batch, 1)).astype("int64"),
    }
    return lambda: train_step(exe, programs, feed)


class LoggedSteps:
    """Steps as an epoch runs them: every ``interval`` steps a LOG record with the fields
    ``loop.train_one_epoch`` gives it, into ``report``."""

    def __init__(self, step, report, interval, batch):
        self.step, self.report, self.interval, self.batch = step, report, interval, batch
        self.done = 0

    def __call__(self):
        start = time.perf_counter()
        values = self.step()
        seconds = time.perf_counter() - start
        self.done += 1
        if self.done % self.interval == 0:
            epoch, within = divmod(self.done, STEPS_PER_EPOCH)
            means = {f"{k}_mean": v for k, v in values.items() if k != "lr"}
            times = {"data_time": 0.0, "compute_time": seconds, "batch_time": seconds}
            record = dict(values, ips=self.batch / seconds, **times, **means)
            record["progress"] = f"{within}/{STEPS_PER_EPOCH}"
            self.report.log([epoch + 1, within], record, console=False)


def cpu_ms(action, times):
    """CPU milliseconds of every thread of this process per call of ``action``, the mean
    over ``times`` calls (Paddle's OpenMP threads asleep by then)."""
    start = time.process_time()
    for _ in range(times):
        action()
    return 1000 * (time.process_time() - start) / times


def writing_costs(folder, values):
    """CPU milliseconds (every thread's) the trackers take, each called as its writing
    thread calls it: a LOG record's scalars (over 100 records, the writes they cause at the
    close included: MLflow batches them, tensorboardX writes on a thread of its own), a
    validation's (each class's accuracy and the confusion image), the drawing of that
    image; and what a step's own thread spends handing a LOG record over (``record``)."""
    time.sleep(1)  # Paddle's OpenMP threads stop spinning
    labels = np.repeat(np.arange(len(CLASSES)), 100)
    predicted = np.where(np.arange(labels.size) % 7 == 0, (labels + 1) % len(CLASSES), labels)
    result = metrics.class_results(
        metrics.confusion_counts(predicted[:, None], labels, len(CLASSES)), CLASSES
    )
    accuracy = {f"val_class/{name}": value for name, value in zip(CLASSES, result["accuracy"])}
    picture = confusion_picture(result, 1)
    costs = {"draw_confusion_image": round(cpu_ms(lambda: confusion_picture(result, 1), 5), 3)}
    scalars = {f"train/{name}": float(value) for name, value in values.items()}
    store = trackers.mlflow_tracking_uri(None, folder)  # the one the contender opened
    steps = iter(range(1, 10**6))
    for name in ALL:
        opened = trackers.opened([name], os.path.join(folder, name), None, store, None, None, True)
        tracker = opened.trackers[name]
        validation = cpu_ms(
            lambda: (
                tracker.scalars(accuracy, next(steps)),
                tracker.image(trackers.CONFUSION_TAG, picture, next(steps)),
            ),
            5,
        )
        start = time.process_time()
        for _ in range(100):
            tracker.scalars(scalars, next(steps))
        opened.close()
        log_record = 1000 * (time.process_time() - start) / 100
        costs[name] = {"log_record": round(log_record, 3), "validation": round(validation, 3)}
    handing_over = trackers.Trackers({})  # no tracker: the step's thread's part only
    record = dict(values, progress=f"1/{STEPS_PER_EPOCH}")
    records, start = 1000, time.thread_time()
    for _ in range(records):
        handing_over.record("LOG", [1, 1], record)
    costs["record_on_the_step_thread"] = round(1000 * (time.thread_time() - start) / records, 4)
    handing_over.close()
    return costs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--print-interval", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="slices of each contender")
    parser.add_argument("--slice-seconds", type=float, default=5.0)
    parser.add_argument("--output", default="benchmarks/trackers_overhead.json")
    args = parser.parse_args()
    config = demo_config(args.batch_size)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(ir.selected(config))
        step = training_step(config)
        values = step()  # warm-up
        opening = time.perf_counter()
        tracked = trackers.opened(ALL, folder, None, None, None, None, True)
        open_seconds = time.perf_counter() - opening
        quiet = stack.enter_context(open(os.devnull, "w"))
        plain = stack.enter_context(Report(os.path.join(folder, "plain.json"), stream=quiet))
        with_trackers = stack.enter_context(
            Report(os.path.join(folder, "tracked.json"), stream=quiet, trackers=tracked)
        )
        contenders = {
            name: LoggedSteps(step, report, args.print_interval, args.batch_size)
            for name, report in (("report", plain), ("report+trackers", with_trackers))
        }

        cpu_per_step = {name: [] for name in contenders}

        def slice_of(name):
            run = contenders[name]

            def timed(seconds):
                steps, cpu = run.done, time.process_time()
                speed = interleave.run_slice(run, args.batch_size, seconds)
                tracked.wait()  # its writing done before the other contender's slice
                # every thread's CPU time (the writing thread's too), a step's share
                cpu_per_step[name].append(1000 * (time.process_time() - cpu) / (run.done - steps))
                return speed

            return timed

        speeds = interleave.alternate(
            {name: slice_of(name) for name in contenders},
            args.rounds,
            args.slice_seconds,
        )
        costs = writing_costs(folder, values)
    ratio = interleave.paired_ratio(speeds["report+trackers"], speeds["report"])
    cpu_ratio = interleave.paired_ratio(cpu_per_step["report+trackers"], cpu_per_step["report"])
    # the trackers' CPU a step, from their measured parts, against a step's own CPU time
    step_cpu_ms = float(np.median(cpu_per_step["report"]))
    per_record = costs["record_on_the_step_thread"] + sum(costs[n]["log_record"] for n in ALL)
    per_validation = costs["draw_confusion_image"] + sum(costs[n]["validation"] for n in ALL)
    share = 100 * per_record / (args.print_interval * step_cpu_ms)
    epoch_share = 100 * per_validation / (STEPS_PER_EPOCH * step_cpu_ms)
    record = {
        "command": " ".join(["python", *sys.argv]),
        "cpu": devices.cpu_model(),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "versions": {
            "paddle": paddle.__version__,
            **{m: require(m, "the benchmark").__version__ for m in MODULES},
        },
        "ir": ir.chosen(config)[0],
        "onednn": bool(onednn_wanted(config)),
        "allocator": bootstrap.allocator(),
        "setting": {
            "arch": "resnet18",
            "crop": 32,
            "batch": args.batch_size,
            "print_interval": args.print_interval,
            "trackers": list(ALL),
        },
        "rounds": args.rounds,
        "slice_seconds": args.slice_seconds,
        "img_per_s": {name: [round(s, 1) for s in slices] for name, slices in speeds.items()},
        "median_img_per_s": {name: interleave.median_speed(s) for name, s in speeds.items()},
        "ratio_trackers_to_report": ratio,
        "step_time_overhead_percent": round(100 * (1 / ratio["median"] - 1), 2),
        "cpu_ms_per_step": {
            name: [round(ms, 2) for ms in slices] for name, slices in cpu_per_step.items()
        },
        "cpu_per_step_ratio_trackers_to_report": cpu_ratio,
        "cpu_per_step_overhead_percent": round(100 * (cpu_ratio["median"] - 1), 2),
        "open_seconds": round(open_seconds, 2),
        "cpu_ms": costs,
        "step_cpu_ms": round(step_cpu_ms, 2),
        "trackers_cpu_share_of_steps_percent": round(share, 3),
        "validation_cpu_share_of_an_epoch_percent": round(epoch_share, 3),
    }
    print(f"report alone      {record['median_img_per_s']['report']:8.1f} img/s")
    print(f"report + trackers {record['median_img_per_s']['report+trackers']:8.1f} img/s")
    print(
        f"the trackers' CPU: {share:.3f} % of the steps' (a LOG record every "
        f"{args.print_interval} steps), {epoch_share:.3f} % of an epoch's for its validation"
    )
    print(
        f"ratio {ratio['median']} (spread {ratio['min']}-{ratio['max']}): step time "
        f"{record['step_time_overhead_percent']:+.2f} %; CPU time a step "
        f"{record['cpu_per_step_overhead_percent']:+.2f} % (spread {cpu_ratio['min']}-"
        f"{cpu_ratio['max']}); trackers opened in {open_seconds:.1f} s"
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as out:
        json.dump(record, out, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(exit_status(main))
