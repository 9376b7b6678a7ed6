"""Proof that the exported formats agree: every backend and precision this machine can
run, over real validation images, against the fp32 Paddle predictor (``export_model.py
--verify-images N``).

Per row: top-1 agreement with fp32 Paddle, the largest probability difference, top-1
accuracy. A row below its tolerance fails the export with one line naming it.
"""

import collections
import dataclasses
import functools
import os

import numpy as np

from paddle_resnet.core import feeds
from paddle_resnet.core.devices import cpu_has_int8_dot_products
from paddle_resnet.core.errors import UserError
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import backends, dali_input, exported, predictor

# Least top-1 agreement with the fp32 Paddle predictor, per precision: fp32 runtimes
# compute the same function (differences of summation order), bf16 keeps 8 bits of
# mantissa, int8 is a quantized model (the demo's PTQ and QAT models agree with fp32 on
# 90-99 % of the images: docs/measurements.md).
MIN_AGREEMENT = {"fp32": 0.99, "bf16": 0.97, "int8": 0.90}


# name: e.g. "openvino bf16"; build: () -> a classifier (images -> probabilities)
Candidate = collections.namedtuple("Candidate", "name precision build")


def machine_precisions(quantized):
    """The CPU precisions this machine runs: int8 for a quantized model where it can, else
    fp32 (and bf16 where it can)."""
    if quantized and cpu_has_int8_dot_products():
        return ["int8"]
    return ["fp32"] + (["bf16"] if predictor.cpu_supports_bf16() else [])


def candidates(model_dir, inference_config, input_shape, max_batch, quantized):
    """Every available CPU backend, in each precision it takes that this machine runs."""
    rows = []
    has_onnx = os.path.exists(os.path.join(model_dir, exported.ONNX_FILE))
    pir = exported.is_pir_export(model_dir)
    for backend in backends.BACKENDS.values():
        needs_onnx = backend.model_precision or (backend.reads_pir_through_onnx and pir)
        if backend.device != "cpu" or not backend.available() or (needs_onnx and not has_onnx):
            continue
        if backend.model_precision:
            precisions = ["int8" if quantized else "fp32"]
        else:
            int8 = quantized and (backend.int8_from_pir or not pir)
            precisions = [p for p in machine_precisions(int8) if p in backend.precisions]
        for precision in precisions:
            flag = "fp32" if backend.model_precision else precision
            settings = dataclasses.replace(inference_config, cpu_precision=flag)
            build = functools.partial(
                backend.build, model_dir, settings, input_shape, max_batch, quantized
            )
            name = backend.name if backend.model_precision else f"{backend.name} {precision}"
            rows.append(Candidate(name, precision, build))
    return rows


def verify(model_dir, data_config, inference_config, count):
    """The verification table over ``count`` images; UserError for a row below tolerance."""
    info = exported.read_info(model_dir)
    input_shape = info["input_shape"]
    split = open_split(data_config, "val").spread(count)
    batches = list(dali_input.validation_batches(split, data_config, info))
    images = [batch[feeds.IMAGE] for batch in batches]
    labels = np.concatenate([batch[feeds.LABEL].ravel() for batch in batches])
    max_batch = max(len(batch) for batch in images)
    quantized = bool(info.get("quantization"))
    fp32 = dataclasses.replace(inference_config, cpu_precision="fp32")
    pir = exported.is_pir_export(model_dir)
    calls = predictor.predictor_settings(fp32, "cpu", input_shape, max_batch, quantized, pir)
    reference = predictor.Classifier(model_dir, calls, input_shape)
    expected = np.concatenate([reference(batch) for batch in images])

    def compared(backend, precision, probs):
        return {
            "backend": backend,
            "precision": precision,
            "agreement": float((probs.argmax(1) == expected.argmax(1)).mean()),
            "max_prob_diff": float(np.abs(probs - expected).max()),
            "top1": float((probs.argmax(1) == labels).mean()),
        }

    rows = [compared("cpu fp32 (reference)", "fp32", expected)]
    for candidate in candidates(model_dir, inference_config, input_shape, max_batch, quantized):
        if candidate.name == "cpu fp32" and not quantized:
            continue  # the reference itself
        classifier = candidate.build()
        probs = np.concatenate([classifier(batch) for batch in images])
        rows.append(compared(candidate.name, candidate.precision, probs))
    for row in rows:
        if row["agreement"] < MIN_AGREEMENT[row["precision"]]:
            raise UserError(
                f"{model_dir}: {row['backend']} agrees with the fp32 Paddle model on "
                f"{100 * row['agreement']:.1f} % of {len(labels)} images, below "
                f"{100 * MIN_AGREEMENT[row['precision']]:.0f} %: the formats disagree"
            )
    return rows, len(labels)


def table(rows, images):
    lines = [
        f"verified on {images} validation images against the fp32 Paddle predictor:",
        f"  {'backend':26s} {'agrees':>8s} {'max prob diff':>14s} {'top-1':>8s}",
    ]
    for row in rows:
        lines.append(
            f"  {row['backend']:26s} {100 * row['agreement']:7.2f}% "
            f"{row['max_prob_diff']:14.2e} {100 * row['top1']:7.2f}%"
        )
    return "\n".join(lines)
