"""Run an exported model with Paddle Inference: accuracy, benchmark or predict.

    python inference.py --trt-inference-dir inference/resnet18_demo --mode accuracy \\
        --image-root demo_data/fashion_mnist_demo
    python inference.py --trt-inference-dir inference/resnet50 --mode benchmark \\
        --backend cpu --cpu-precision bf16 --benchmark-batch-sizes 1,32 --trt-use-synthat
    python inference.py --trt-inference-dir inference/resnet18_demo --mode predict \\
        --images photo.jpg,more_photos/

Preprocessing (resize, crop, normalisation, layout) comes from the model's
model.json, written by export_model.py, so it always matches training.
"""
import dataclasses
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("FLAGS_enable_pir_api", "0")

import numpy as np  # noqa: E402

from paddle_resnet.cli import main_with  # noqa: E402
from paddle_resnet.errors import DataError  # noqa: E402

PERCENTILES = (50, 90, 95, 99)


def data_config_for_model(config, info):
    """The validation preprocessing the model was exported with."""
    pre = info["preprocess"]
    return dataclasses.replace(config.data, crop_size=pre["crop_size"], resize_short=pre["resize_short"],
                               normalize_mean=tuple(pre["normalize_mean"]),
                               normalize_std=tuple(pre["normalize_std"]))


def build_classifier(config, max_batch):
    from paddle_resnet import predictor

    inf = config.inference
    predictor.check_model_dir(inf.model_dir)
    info = predictor.read_model_info(inf.model_dir)
    backend = predictor.resolve_backend(inf.backend)
    calls = predictor.predictor_settings(inf, backend, info["input_shape"], max_batch)
    return predictor.Classifier(inf.model_dir, calls, info["input_shape"]), info, backend


def val_batches(data_split, data_cfg, layout):
    from paddle_resnet.data.dali import make_loader

    return make_loader(data_split, data_cfg, layout, training=False)


def accuracy(config, report):
    """Top-1 / top-k over every image of <image-root>/val, exactly once."""
    from paddle_resnet.data.dali import open_split
    from paddle_resnet.data.folder import check_num_classes
    from paddle_resnet.trainer import count_eval_batch

    classifier, info, backend = build_classifier(config, config.data.batch_size)
    images = open_split(config.data, "val")
    check_num_classes(images, info["num_classes"], f"{config.data.image_root}/val")
    totals = np.zeros(4)
    start = time.perf_counter()
    k = min(5, info["num_classes"])
    for batch in val_batches(images, data_config_for_model(config, info), info["layout"]):
        probs = classifier(batch["data"])
        top = np.argsort(-probs, axis=1)[:, :k]
        picked = probs[np.arange(len(probs)), batch["label"].ravel()]
        totals += count_eval_batch(top, -np.log(np.maximum(picked, 1e-12)), batch["label"])
    count = totals[0]
    result = {"backend": backend, "images": int(count), "top1": totals[1] / count,
              f"top{k}": totals[2] / count, "loss": totals[3] / count,
              "seconds": time.perf_counter() - start}
    report.log("ACCURACY", result, kind="SUMMARY")
    return result


def latency_summary(batch_size, seconds):
    """Throughput and latency percentiles (ms) of per-batch timings."""
    ms = np.asarray(seconds) * 1000.0
    summary = {"batch_size": batch_size, "ips": batch_size / float(np.mean(seconds)),
               "latency_avg": float(ms.mean())}
    summary.update({f"latency_p{p}": float(np.percentile(ms, p)) for p in PERCENTILES})
    return summary


def benchmark(config, report):
    """For each batch size: warm-up runs, then timed runs on synthetic or real images."""
    inf, run_cfg = config.inference, config.run
    classifier, info, backend = build_classifier(config, max(inf.batch_sizes))
    pool = _benchmark_images(config, info, max(inf.batch_sizes))
    rows = []
    for batch_size in inf.batch_sizes:
        batch = pool[:batch_size]
        for _ in range(run_cfg.benchmark_warmup_steps):
            classifier(batch)
        seconds = []
        for _ in range(run_cfg.benchmark_steps):
            start = time.perf_counter()
            classifier(batch)
            seconds.append(time.perf_counter() - start)
        row = dict(latency_summary(batch_size, seconds), backend=backend,
                   precision=inf.trt_precision if backend == "trt" else inf.cpu_precision,
                   input="synthetic" if inf.trt_use_synthetic else "real")
        report.log("BENCHMARK", row, kind="SUMMARY", console=False)
        rows.append(row)
    report.print(format_table(rows))
    return rows


def _benchmark_images(config, info, count):
    if config.inference.trt_use_synthetic or not config.data.image_root:
        rng = np.random.default_rng(0)
        return rng.standard_normal([count] + list(info["input_shape"])).astype(np.float32)
    from paddle_resnet.data.dali import open_split

    images = open_split(config.data, "val")
    arrays = []
    for batch in val_batches(images, data_config_for_model(config, info), info["layout"]):
        arrays.append(batch["data"])
        if sum(len(a) for a in arrays) >= count:
            break
    pool = np.concatenate(arrays)
    return np.resize(pool, (count,) + pool.shape[1:])      # repeat when there are fewer images


def format_table(rows):
    header = f"{'batch':>5} {'img/s':>9} {'avg ms':>8}" + "".join(f" {'p' + str(p):>8}" for p in PERCENTILES)
    lines = [header]
    for row in rows:
        lines.append(f"{row['batch_size']:>5} {row['ips']:>9.1f} {row['latency_avg']:>8.2f}"
                     + "".join(f" {row[f'latency_p{p}']:>8.2f}" for p in PERCENTILES))
    return "\n".join(lines)


def predict(config, report):
    """Top-5 class names with probabilities for each given image (files or folders)."""
    from paddle_resnet.data.dali import DataSplit
    from paddle_resnet.data.folder import (IMAGE_EXTENSIONS, ImageList, find_unreadable_image,
                                           read_class_index)
    from paddle_resnet.predictor import CLASSES_FILE

    files = []
    for path in config.inference.images:
        if os.path.isdir(path):
            files.extend(sorted(os.path.join(path, f) for f in os.listdir(path)
                                if f.lower().endswith(IMAGE_EXTENSIONS)))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataError(f"{path}: no such image file or folder")
    if not files:
        raise DataError("predict needs --images (files or folders holding images)")
    # Checked before DALI sees them: DALI 2.4's CPU decoder crashes (SIGSEGV) when
    # dozens of samples of one batch fail, as when a broken file pads the last batch.
    broken = find_unreadable_image(files)
    if broken:
        raise DataError(f"{broken}: cannot be decoded as an image")
    classifier, info, _ = build_classifier(config, config.data.batch_size)
    classes = read_class_index(os.path.join(config.inference.model_dir, CLASSES_FILE))
    image_list = DataSplit.of_images("predict", ImageList(tuple(files), (0,) * len(files),
                                                           tuple(classes)))
    predictions, position = [], 0
    for batch in val_batches(image_list, data_config_for_model(config, info), info["layout"]):
        for probs in classifier(batch["data"]):
            top = np.argsort(-probs)[:5]
            entry = {"image": files[position],
                     "top5": [{"class": classes[i], "probability": float(probs[i])} for i in top]}
            predictions.append(entry)
            report.log("PREDICT", entry, kind="PREDICT", console=False)
            report.print(files[position] + ": " + ", ".join(
                f"{p['class']} {p['probability']:.3f}" for p in entry["top5"]))
            position += 1
    return predictions


MODES = {"accuracy": accuracy, "benchmark": benchmark, "predict": predict}


def run(config, report_stream=None):
    from paddle_resnet.report import Report

    report = Report(config.inference.log_path, stream=report_stream or sys.stdout)
    report.log("PARAMETER", config.to_dict(), kind="PARAMETER", console=False)
    try:
        return MODES[config.inference.mode](config, report)
    finally:
        report.close()


def main(argv=None):
    return main_with(__doc__.splitlines()[0], run, argv, inference=True)


if __name__ == "__main__":
    sys.exit(main())
