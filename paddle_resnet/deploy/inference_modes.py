"""What inference.py does with an exported model: accuracy over a validation tree,
latency and throughput per batch size, or the classes of image files; ``--mode serve``
hands the process over to the server. Preprocessing comes from the model's model.json,
so it always matches training."""

import os
import sys
import time

import numpy as np

from paddle_resnet.core import devices, feeds
from paddle_resnet.core.errors import DataError
from paddle_resnet.core.metrics import (
    accuracy_from_counts,
    add_confusions,
    class_results,
    describe_class_results,
    eval_counts,
    format_latency_table,
    latency_summary,
    time_steps,
    top_k,
)
from paddle_resnet.core.report import Report
from paddle_resnet.data.dali import DataSplit, open_split
from paddle_resnet.data.folder import (
    IMAGE_EXTENSIONS,
    ImageList,
    check_class_names,
    check_num_classes,
    class_contents,
    unreadable_images,
)
from paddle_resnet.deploy import backends, dali_input, exported, serve


def build_classifier(config, max_batch, report=None):
    """(classifier, model.json content, backend row); the lines on it go to ``report``."""
    classifier, info, backend, notes = backends.build_classifier(config.inference, max_batch)
    for line in notes if report is not None else ():
        report.print(line)
    return classifier, info, backend


def accuracy(config, report):
    """Top-1 / top-k over every image of <image-root>/val, exactly once."""
    classifier, info, backend = build_classifier(config, config.data.batch_size, report)
    val_split, where = open_split(config.data, "val"), f"{config.data.image_root}/val"
    check_num_classes(val_split, info["num_classes"], where)
    model_dir = config.inference.directory
    check_class_names(val_split.classes, exported.read_classes(model_dir), where, model_dir)
    classes = val_split.classes
    totals, confusion = np.zeros(4), np.zeros((len(classes), len(classes)))
    start = time.perf_counter()
    k = top_k(info["num_classes"])
    for batch in dali_input.validation_batches(val_split, config.data, info):
        probs = classifier(batch[feeds.IMAGE])
        top = np.argsort(-probs, axis=1)[:, :k]
        labels = batch[feeds.LABEL]
        picked = probs[np.arange(len(probs)), labels.ravel()]
        totals += eval_counts(top, -np.log(np.maximum(picked, 1e-12)), labels)
        add_confusions(confusion, top, labels)
    per_class = class_results(confusion, classes)
    result = dict(
        accuracy_from_counts(totals, k),
        balanced_top1=per_class["balanced_top1"],
        backend=backend.name,
        seconds=time.perf_counter() - start,
    )
    report.log("ACCURACY", result, kind="SUMMARY")
    _report_classes(report, per_class)
    return dict(result, classes=per_class)


def _report_classes(report, per_class):
    """The per-class results in the report (a CLASSES record) and on the console."""
    report.log("CLASSES", per_class, kind="CLASSES", console=False)
    for line in describe_class_results(per_class):
        report.print(line)


def benchmark(config, report):
    """For each batch size: warm-up runs, then timed runs on synthetic or real images."""
    inf, run_cfg = config.inference, config.run
    classifier, info, backend = build_classifier(config, max(inf.batch_sizes), report)
    pool = _benchmark_images(config, info, max(inf.batch_sizes))
    rows = []
    for batch_size in inf.batch_sizes:
        batch = pool[:batch_size]
        seconds = time_steps(
            lambda: classifier(batch), run_cfg.benchmark_warmup_steps, run_cfg.benchmark_steps
        )
        row = dict(
            latency_summary(batch_size, seconds),
            backend=backend.name,
            precision=backends.precision_of(backend, inf),
            input="synthetic" if inf.use_synthetic else "real",
        )
        report.log("BENCHMARK", row, kind="SUMMARY", console=False)
        rows.append(row)
    report.print(format_latency_table(rows))
    return rows


def _benchmark_images(config, info, count):
    if config.inference.use_synthetic or not config.data.image_root:
        rng = np.random.default_rng(0)
        return rng.standard_normal([count] + list(info["input_shape"])).astype(np.float32)
    arrays = []
    for batch in dali_input.validation_batches(open_split(config.data, "val"), config.data, info):
        arrays.append(batch[feeds.IMAGE])
        if sum(len(a) for a in arrays) >= count:
            break
    pool = np.concatenate(arrays)
    return np.resize(pool, (count,) + pool.shape[1:])  # repeat when there are fewer images


def _predict_files(paths):
    """The image files of ``paths``: files, and folders read with their subfolders."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = class_contents(path)[0]  # its subfolders' images too
            if not found:
                raise DataError(
                    f"{path}: no images in it or its subfolders ({', '.join(IMAGE_EXTENSIONS)})"
                )
            files.extend(found)
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataError(f"{path}: no such image file or folder")
    if not files:
        raise DataError("predict needs --images (files or folders holding images)")
    return files


def predict(config, report):
    """Top-k classes of each given image, and the accuracy over those in folders named after
    classes; images that cannot be decoded are named, left out, and then refused."""
    given = _predict_files(config.inference.images)
    # Checked before DALI sees them: DALI 2.4's CPU decoder crashes (SIGSEGV) when
    # dozens of samples of one batch fail, as when a broken file pads the last batch.
    broken = list(unreadable_images(given))
    for path in broken:
        report.print(f"{path}: cannot be decoded as an image; skipped")
    files = [path for path in given if path not in frozenset(broken)]
    predictions = _predict(config, report, files) if files else []
    if broken:
        raise DataError(
            f"{len(broken)} of {len(given)} images cannot be decoded as images, e.g. {broken[0]}"
        )
    return predictions


def _predict(config, report, files):
    classifier, info, _ = build_classifier(config, config.data.batch_size, report)
    classes = exported.read_classes(config.inference.directory)
    listed = ImageList(tuple(files), (0,) * len(files), tuple(classes))
    images = DataSplit.of_images("predict", listed)
    k, predictions = top_k(len(classes)), []
    confusion = np.zeros((len(classes), len(classes)))
    index = {name: i for i, name in enumerate(classes)}  # a folder named as a class: its label
    for batch in dali_input.validation_batches(images, config.data, info):
        for probs in classifier(batch[feeds.IMAGE]):
            image = files[len(predictions)]
            best = np.argsort(-probs)[:k]
            top = [{"class": classes[i], "probability": float(probs[i])} for i in best]
            predictions.append({"image": image, "top": top})
            report.log("PREDICT", predictions[-1], kind="PREDICT", console=False)
            tops = ", ".join(f"{p['class']} {p['probability']:.3f}" for p in top)
            report.print(f"{image}: {tops}")
            folder = os.path.basename(os.path.dirname(image))
            if folder in index:
                add_confusions(confusion, best[None], [index[folder]])
    if confusion.any():
        per_class = class_results(confusion, classes)
        labelled = int(confusion.sum())
        report.print(
            f"{labelled} of {len(files)} images are in folders named after classes: top-1 "
            f"{100 * np.trace(confusion) / labelled:.2f} %"
        )
        _report_classes(report, per_class)
    return predictions


MODES = {"accuracy": accuracy, "benchmark": benchmark, "predict": predict}


def run(config, report_stream=None):
    if config.inference.mode == "serve":  # the server, in its own environment (serve.py)
        return serve.hand_over(config)
    report = Report(config.inference.log_path, stream=report_stream or sys.stdout)
    report.log("PARAMETER", config.to_dict(), kind="PARAMETER", console=False)
    # Only Paddle's own CPU predictor falls back from a GPU build: elsewhere the note is noise.
    note = devices.cpu_fallback_note() if config.inference.backend in ("auto", "cpu") else None
    if note:
        report.print(note)
    try:
        return MODES[config.inference.mode](config, report)
    finally:
        report.close()
