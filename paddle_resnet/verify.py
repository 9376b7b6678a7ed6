"""Proof that the exported formats agree: every backend and precision this machine can
run, over real validation images, against the fp32 Paddle predictor (``export_model.py
--verify-images N``).

Per row: top-1 agreement with fp32 Paddle, the largest probability difference, top-1
accuracy. A row below its tolerance fails the export with one line naming it.
"""

import dataclasses
import os

import numpy as np

from paddle_resnet import exported, feeds, model_input, optional, predictor
from paddle_resnet.data.dali import open_split
from paddle_resnet.errors import UserError
from paddle_resnet.openvino_runtime import OpenVinoClassifier
from paddle_resnet.quantization import cpu_has_int8_dot_products

# Least top-1 agreement with the fp32 Paddle predictor, per precision: fp32 runtimes
# compute the same function (differences of summation order), bf16 keeps 8 bits of
# mantissa, int8 is a quantized model (the demo's PTQ and QAT models agree with fp32 on
# 90-99 % of the images: docs/measurements.md).
MIN_AGREEMENT = {"fp32": 0.99, "bf16": 0.97, "int8": 0.90}


@dataclasses.dataclass
class Candidate:
    name: str  # e.g. "openvino bf16"
    precision: str
    build: object  # () -> a classifier (images -> probabilities)


def candidates(model_dir, inference_config, input_shape, max_batch, quantized):
    """What this machine can run of the exported model in ``model_dir``."""
    rows = []
    precisions = ["fp32"]
    if predictor.cpu_supports_bf16():
        precisions.append("bf16")
    if quantized and cpu_has_int8_dot_products():
        precisions = ["int8"]  # a quantized model runs as int8
    for precision in precisions:
        settings = dataclasses.replace(inference_config, cpu_precision=precision)
        rows.append(
            Candidate(
                f"paddle {precision}",
                precision,
                lambda s=settings: predictor.Classifier(
                    model_dir,
                    predictor.predictor_settings(s, "cpu", input_shape, max_batch, quantized),
                    input_shape,
                ),
            )
        )
        if optional.has_openvino:
            rows.append(
                Candidate(
                    f"openvino {precision}",
                    precision,
                    lambda s=settings: OpenVinoClassifier(
                        model_dir, s, input_shape, max_batch, quantized
                    ),
                )
            )
    onnx_file = os.path.join(model_dir, exported.ONNX_FILE)
    if os.path.exists(onnx_file) and optional.has_onnxruntime:
        rows.append(
            Candidate(
                "onnxruntime", "int8" if quantized else "fp32", lambda: OnnxClassifier(onnx_file)
            )
        )
    return rows


class OnnxClassifier:
    def __init__(self, path):
        onnxruntime = optional.require("onnxruntime", "verifying model.onnx")
        self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, images):
        return self.session.run(None, {self.input: np.ascontiguousarray(images, np.float32)})[0]


def verify(model_dir, data_config, inference_config, count):
    """The verification table of the export in ``model_dir`` over ``count`` validation
    images; UserError naming the first row below its tolerance."""
    info = exported.read_info(model_dir)
    input_shape = info["input_shape"]
    split = open_split(data_config, "val").spread(count)
    batches = list(model_input.validation_batches(split, data_config, info))
    images = [batch[feeds.IMAGE] for batch in batches]
    labels = np.concatenate([batch[feeds.LABEL].ravel() for batch in batches])
    max_batch = max(len(batch) for batch in images)
    fp32_settings = dataclasses.replace(inference_config, cpu_precision="fp32")
    reference = predictor.Classifier(
        model_dir,
        predictor.predictor_settings(fp32_settings, "cpu", input_shape, max_batch, quantized=False),
        input_shape,
    )
    expected = np.concatenate([reference(batch) for batch in images])
    rows = [
        {
            "backend": "paddle fp32 (reference)",
            "precision": "fp32",
            "agreement": 1.0,
            "max_prob_diff": 0.0,
            "top1": float((expected.argmax(1) == labels).mean()),
        }
    ]
    quantized = bool(info.get("quantization"))
    for candidate in candidates(model_dir, inference_config, input_shape, max_batch, quantized):
        if candidate.name == "paddle fp32" and not quantized:
            continue  # the reference itself
        classifier = candidate.build()
        probs = np.concatenate([classifier(batch) for batch in images])
        rows.append(
            {
                "backend": candidate.name,
                "precision": candidate.precision,
                "agreement": float((probs.argmax(1) == expected.argmax(1)).mean()),
                "max_prob_diff": float(np.abs(probs - expected).max()),
                "top1": float((probs.argmax(1) == labels).mean()),
            }
        )
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
