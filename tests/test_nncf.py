"""OpenVINO's own int8 (NNCF), the benchmarks' yardstick: quantized in a process of its
own with NNCF's folder on that process's path only (deploy/nncf_int8.py), never in
the process that runs Paddle."""

import os
import sys

import numpy as np
import pytest

from conftest import flat, once
from paddle_resnet.core import feeds, optional
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy import exported, nncf_int8

needs_nncf = pytest.mark.skipif(
    not os.path.isdir(os.path.join(nncf_int8.DEFAULT_SITE, "nncf"))
    or not (optional.has_openvino and optional.has_paddle2onnx),
    reason="needs NNCF (scripts/setup_nncf.sh), OpenVINO and paddle2onnx",
)


@pytest.fixture(scope="module")
def fp32_onnx(trained, tmp_path_factory):
    """The suite's trained model exported in fp32 with its model.onnx."""
    out = str(tmp_path_factory.mktemp("nncf") / "fp32")
    config = build_config(
        dict(
            flat(trained),
            **{
                "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                "inference.model_dir": out,
                "inference.export_log_path": out + ".json",
                "inference.onnx": True,
                "inference.calibration_images": 16,
            },
        )
    )
    exporting.export(config)
    return config


@once
@needs_nncf
def test_nncf_quantizes_in_a_process_of_its_own(fp32_onnx, tmp_path):
    ov = optional.require("openvino", "this test")
    info = exported.read_info(fp32_onnx.inference.directory)
    batches = [b[feeds.IMAGE] for b in exporting.calibration_batches(fp32_onnx, info)]
    onnx_path = os.path.join(fp32_onnx.inference.directory, exported.ONNX_FILE)
    out = nncf_int8.quantize(
        nncf_int8.DEFAULT_SITE, onnx_path, batches, "performance", str(tmp_path / "int8.xml")
    )
    assert os.path.exists(out) and os.path.exists(out[: -len(".xml")] + ".bin")
    model = ov.Core().read_model(out)
    quantizers = [op for op in model.get_ops() if op.get_type_name() == "FakeQuantize"]
    assert quantizers, "NNCF's model holds no int8 quantizers"
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert compiled(batches[0])[0].shape == (len(batches[0]), fp32_onnx.model.num_classes)
    assert "nncf" not in sys.modules and nncf_int8.version(nncf_int8.DEFAULT_SITE, "this test")


def test_without_nncf_one_line_names_its_set_up(tmp_path):
    with pytest.raises(UserError, match=r"^--nncf needs the optional package nncf: .*setup_nncf"):
        nncf_int8.version(str(tmp_path), "--nncf")


@needs_nncf
def test_a_failure_inside_nncf_is_one_line(tmp_path):
    missing = str(tmp_path / "missing.onnx")
    with pytest.raises(
        UserError, match=r"^NNCF \(.*\) failed for the performance int8 of .*missing.onnx \(.+\)$"
    ):
        nncf_int8.quantize(
            nncf_int8.DEFAULT_SITE,
            missing,
            [np.zeros((1, 3, 8, 8), np.float32)],
            "performance",
            str(tmp_path / "int8.xml"),
        )
