"""paddle-resnet-serve: an export served over the Open Inference Protocol (KServe v2), REST
and gRPC, by a real server process on free ports, asked by real clients: tritonclient's http
and grpc clients (tests/serve_client.py). Both run in the serving environment (.venv-serve,
scripts/setup_serve.sh: KServe and tritonclient need a protobuf Paddle 2.6 refuses), on the
small export the suite trains; the reference is this environment's inference.py --mode
predict on the same images. Then what a bad request gets, a SIGTERM while a request is in
flight (through inference.py --mode serve, which becomes the server), and the
InferenceService manifest, checked offline (it is not applied).

No timing: speeds come from scripts/benchmark_serving.py."""

import base64
import fcntl
import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import kubernetes_validate
import numpy as np
import pytest
import yaml
from PIL import Image

from conftest import ROOT, flat, once
from paddle_resnet.core import feeds
from paddle_resnet.core.cli import parse
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError
from paddle_resnet.data.dali import DataSplit
from paddle_resnet.data.folder import scan_split
from paddle_resnet.deploy import backends, dali_input, exported, inference_modes
from paddle_resnet.deploy import export as exporting
from paddle_resnet.deploy.encoded_input import ImagePreprocessing
from paddle_resnet.deploy.open_inference import ServedExport

# A server process of its own environment, Paddle 3.3.1's, whatever this one is: run once,
# on 2.6.2.
pytestmark = once

SERVING = os.path.join(ROOT, ".venv-serve")
SERVING_PYTHON = os.path.join(SERVING, "bin", "python")
CLIENT = os.path.join(ROOT, "tests", "serve_client.py")
MANIFEST = os.path.join(
    ROOT, "scripts", "cluster", "kubernetes", "serving", "inferenceservice.yaml"
)
MODEL = "fmnist"
MAX_BATCH = 8
MAX_REQUEST_MB = 6
# the server's --max-image-pixels: the 3000 x 3000 JPEGs of the last test, not the 12,000 x
# 12,000 PNG (the default for the 32 px export would be 409,600)
MAX_IMAGE_PIXELS = 10_000_000
# The same engine on the same tensors, in batches of other sizes: OpenVINO's CPU kernels
# block by batch, so float32 sums round differently by a few ulps of the probabilities.
ENGINE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def serving_python():
    """The serving environment's python, once its setup (scripts/test.sh runs it beside the
    suite) has finished."""
    with open(SERVING + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    if not os.path.exists(os.path.join(SERVING, ".installed")):
        pytest.skip("no serving environment: bash scripts/setup_serve.sh")
    return SERVING_PYTHON


@pytest.fixture(scope="module")
def export(trained, tmp_path_factory):
    """The suite's trained ResNet-18 (32 px, 10 classes) exported and verified on OpenVINO,
    so that --backend auto serves it there, as inference.py runs it."""
    out = tmp_path_factory.mktemp("served")
    config = build_config(
        dict(
            flat(trained),
            **{
                "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
                "inference.model_dir": str(out / "model"),
                "inference.export_log_path": str(out / "export.json"),
                "inference.verify_images": 8,
            },
        )
    )
    exporting.export(config)
    return config


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_status(port, path, body=None, content_type="application/json", headers=()):
    """(status, body) of a plain HTTP request to the server (what tritonclient does not
    send: a JSON body with images in base64 as curl sends it, a body that is no request)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
    if body is not None:
        request.add_header("content-type", content_type)
    for name, value in headers:
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:  # not listening (yet)
        return None, b""


class Server:
    """A server process started by ``command`` on free ports; its output in ``log``."""

    def __init__(self, command, log, http_port, grpc_port):
        self.log, self.http_port, self.grpc_port = log, http_port, grpc_port
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT
        )
        self.answers_before_ready = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and self.process.poll() is None:
            status, _ = http_status(http_port, "/v2/health/ready")
            if status == 200:
                # the warm-up's line comes before the server says it is ready
                assert "ready: warm-up ran batches of" in self.output()
                return
            self.answers_before_ready.append(status)
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"the server did not get ready:\n{self.output()[-3000:]}")

    def output(self):
        with open(self.log) as handle:
            return handle.read()

    def ask(self, calls, python):
        """Each call through tests/serve_client.py's real clients: their results."""
        plan = {
            "http": f"127.0.0.1:{self.http_port}",
            "grpc": f"127.0.0.1:{self.grpc_port}",
            "model": MODEL,
            "calls": calls,
        }
        result = subprocess.run(
            [python, CLIENT], input=json.dumps(plan), capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            return self.process.wait(timeout=120)
        return self.process.returncode


@pytest.fixture(scope="module")
def server(serving_python, export, tmp_path_factory):
    """The server of the export, started as ``inference.py --mode serve`` (in this
    environment, without KServe: the process becomes the serving environment's server):
    batches of up to 8 images, a first request waiting up to 100 ms for others, requests
    up to 6 MB, images up to 10 M px, on this machine's loopback only (--host). The last
    test of the file stops it."""
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "inference.py", "--mode", "serve"]
    command += ["--inference-dir", export.inference.model_dir]
    for key, value in (
        ("serve.http_port", http_port),
        ("serve.grpc_port", grpc_port),
        ("serve.max_batch", MAX_BATCH),
        ("serve.max_wait_ms", 100),
        ("serve.max_request_mb", MAX_REQUEST_MB),
        ("serve.max_image_pixels", MAX_IMAGE_PIXELS),
        ("serve.model_name", MODEL),
        ("serve.host", "127.0.0.1"),
    ):
        command += ["--set", f"{key}={value}"]
    log = str(tmp_path_factory.mktemp("server") / "server.log")
    running = Server(command, log, http_port, grpc_port)
    yield running
    assert running.stop() == 0, running.output()[-3000:]


@pytest.fixture(scope="module")
def predicted(export, fmnist_root, tmp_path_factory):
    """inference.py --mode predict's top classes of every validation image (a tree of the
    model's class folders), in this environment (DALI's preprocessing)."""
    values = dict(
        flat(export),
        **{
            "inference.mode": "predict",
            "inference.images": (os.path.join(fmnist_root, "val"),),
            "inference.log_path": str(tmp_path_factory.mktemp("predict") / "predict.json"),
        },
    )
    found = inference_modes.run(build_config(values), report_stream=io.StringIO())
    return {entry["image"]: entry["top"] for entry in found}


def validation_tensors(root, data_config, info, count):
    """(files, the first ``count`` validation images as the validation pipeline feeds the
    model)."""
    images = scan_split(root, "val")
    split = DataSplit.of_images("val", images)
    tensors = []
    for batch in dali_input.validation_batches(split, data_config, info):
        tensors.extend(np.array(batch[feeds.IMAGE]))
        if len(tensors) >= count:
            break
    return images.files[:count], np.stack(tensors[:count])


def engine(classifier, tensors, batch=8):
    """``classifier``'s probabilities of ``tensors``, in batches of ``batch``."""
    tensors = np.asarray(tensors)
    return np.concatenate(
        [classifier(tensors[start : start + batch]) for start in range(0, len(tensors), batch)]
    )


def test_encoded_images_are_preprocessed_as_the_validation_pipeline_does(
    fmnist_root, imagenet_root
):
    """The server's Pillow preprocessing against DALI's validation pipeline, in grey levels
    before normalisation: Fashion-MNIST's 28 px resized to 32 within one level; ImageNet
    photos (512 px) resized to 256 and cropped to 224 within half a level on average."""
    for root, size, crop, mean_limit, max_limit in (
        (fmnist_root, 32, 32, 0.3, 1.01),
        (imagenet_root, 256, 224, 0.5, 16.0),
    ):
        config = build_config(
            {"data.image_root": root, "data.batch_size": 20, "data.num_threads": 1}
        )
        info = {
            "layout": "NCHW",
            "input_shape": [3, crop, crop],
            "preprocess": {
                "resize_short": size,
                "crop_size": crop,
                "normalize_mean": [0.485, 0.456, 0.406],
                "normalize_std": [0.229, 0.224, 0.225],
                "normalize_scale": 1 / 255,
            },
        }
        files, expected = validation_tensors(root, config.data, info, 20)
        served = np.stack([ImagePreprocessing(info)(open(f, "rb").read()) for f in files])
        levels = np.abs(served - expected) * (np.array([0.229, 0.224, 0.225]) * 255)[:, None, None]
        assert levels.reshape(len(files), -1).mean(axis=1).max() <= mean_limit, root
        assert levels.max() <= max_limit, root


def test_real_clients_get_what_inference_py_predicts(
    server, serving_python, export, predicted, fmnist_root, tmp_path
):
    """tritonclient over REST and gRPC: health, the model's metadata (inputs, outputs,
    classes, backend, precision, sparsity), every validation JPEG in requests of 1 to 8
    sent together (batched by the server) and one by one, and tensors: the top-1 is
    predict's (where predict's lead is not a near tie), the probabilities the same engine's
    on the same tensors."""
    files = sorted(predicted)
    sizes = []  # 1, 2, ... 8, 1, 2, ...: every request size up to a batch
    while sum(sizes) < len(files):
        sizes.append(min(1 + len(sizes) % MAX_BATCH, len(files) - sum(sizes)))
    info = exported.read_info(export.inference.model_dir)
    tensor_files, tensors = validation_tensors(fmnist_root, export.data, info, 16)
    np.save(tmp_path / "tensors.npy", tensors)
    jpegs = {"input": "images", "datatype": "BYTES", "images": [{"file": f} for f in files]}
    batch = {"input": feeds.IMAGE, "datatype": "FP32", "npy": str(tmp_path / "tensors.npy")}
    results = server.ask(
        [
            {"op": "health", "protocol": "http"},
            {"op": "health", "protocol": "grpc"},
            {"op": "metadata", "protocol": "http"},
            {"op": "metadata", "protocol": "grpc"},
            dict(jpegs, op="infer", protocol="http", sizes=sizes, concurrent=True),
            dict(jpegs, op="infer", protocol="grpc", sizes=sizes, top_k=3),
            dict(batch, op="infer", protocol="http", sizes=[8, 8]),
            dict(batch, op="infer", protocol="grpc", sizes=[3, 5, 8]),
        ],
        serving_python,
    )
    health_http, health_grpc, meta_http, meta_grpc = results[:4]
    assert health_http == health_grpc == {"live": True, "ready": True, "model_ready": True}
    inputs = [
        {"name": "images", "datatype": "BYTES", "shape": [-1]},
        {"name": feeds.IMAGE, "datatype": "FP32", "shape": [-1, 3, 32, 32]},
    ]
    assert meta_http["inputs"] == meta_grpc["inputs"] == inputs
    names = [o["name"] for o in meta_http["outputs"]]
    assert names == [o["name"] for o in meta_grpc["outputs"]]
    assert names == ["probabilities", "top_classes", "top_probabilities"]
    classes = list(exported.read_classes(export.inference.model_dir))
    parameters = meta_http["parameters"]
    assert parameters["classes"] == classes and len(classes) == 10
    assert (parameters["backend"], parameters["precision"]) == ("openvino", "fp32")
    assert (parameters["sparsity"], parameters["quantization"]) == ("dense", "none")
    assert meta_grpc["platform"] == "paddle-resnet_openvino_fp32"
    # What each image should get: the served probabilities are the engine's on the
    # server's own preprocessing (Pillow, encoded_input.py); predict's are the engine's on
    # DALI's validation pipeline. The two preprocessings differ by up to a grey level
    # (test_encoded_images_are_preprocessed_as_the_validation_pipeline_does), which moves
    # each image's probabilities by ``moved``: where predict's lead over its second class
    # is more than twice that, the server's top-1 must be predict's (a served label in the
    # wrong class order, or another image's answer, breaks it).
    classifier, _, _, _ = backends.build_classifier(export.inference, 16)
    pillow = ImagePreprocessing(info)
    served_expected = engine(classifier, [pillow(open(f, "rb").read()) for f in files])
    dali_files, dali_tensors = validation_tensors(fmnist_root, export.data, info, len(files))
    assert sorted(dali_files) == files
    dali_expected = dict(zip(dali_files, engine(classifier, dali_tensors)))
    compared = 0
    for call, k in ((results[4], 5), (results[5], 3)):
        served = [
            row
            for answer in call["answers"]
            for row in zip(
                answer["probabilities"], answer["top_classes"], answer["top_probabilities"]
            )
        ]
        assert len(served) == len(files) and len(call["answers"]) == len(sizes)
        for answer in call["answers"]:  # a request runs in one batch, with others or alone
            assert MAX_BATCH >= answer["batch_size"] >= len(answer["top_classes"])
        for index, (image, row) in enumerate(zip(files, served)):
            probabilities, top_classes, top_probabilities = row
            top = predicted[image]
            assert len(top_classes) == len(top_probabilities) == k
            assert top_probabilities == sorted(top_probabilities, reverse=True)
            assert [probabilities[classes.index(c)] for c in top_classes] == top_probabilities
            np.testing.assert_allclose(probabilities, served_expected[index], atol=ENGINE_TOLERANCE)
            best = classes.index(top[0]["class"])
            assert abs(top[0]["probability"] - dali_expected[image][best]) <= ENGINE_TOLERANCE
            moved = np.abs(served_expected[index] - dali_expected[image]).max()
            if top[0]["probability"] - top[1]["probability"] > 2 * (moved + ENGINE_TOLERANCE):
                assert top_classes[0] == top[0]["class"], image
                compared += 1
    assert compared >= 0.8 * 2 * len(files)  # near ties are few
    # the JSON form (curl -d, no content type): the image in base64, as README's example
    with open(files[0], "rb") as handle:
        image = base64.b64encode(handle.read()).decode()
    request = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [image]}]}
    request["parameters"] = {"top_k": 2}
    status, body = http_status(
        server.http_port,
        f"/v2/models/{MODEL}/infer",
        json.dumps(request).encode(),
        "application/x-www-form-urlencoded",
    )
    outputs = {output["name"]: output["data"] for output in json.loads(body)["outputs"]}
    assert (
        status == 200 and outputs["top_classes"] == results[4]["answers"][0]["top_classes"][0][:2]
    )
    expected = classifier(tensors)
    for call in results[6:]:
        probabilities = np.concatenate([answer["probabilities"] for answer in call["answers"]])
        np.testing.assert_allclose(probabilities, expected, atol=ENGINE_TOLERANCE)


# A bad request, what the server answers over each protocol (REST status, gRPC status), and
# the one line naming the problem.
BAD_REQUESTS = [
    (
        {
            "input": feeds.IMAGE,
            "datatype": "INT32",
            "zeros": {"shape": [1, 3, 32, 32], "dtype": "int32"},
        },
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "input 'data' is INT32: expected FP32",
    ),
    (
        {
            "input": feeds.IMAGE,
            "datatype": "FP32",
            "zeros": {"shape": [2, 3, 28, 28], "dtype": "float32"},
        },
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "input 'data' has shape [2, 3, 28, 28]: expected [n, 3, 32, 32]",
    ),
    (
        {"input": "images", "datatype": "BYTES", "images": [{"text": "not an image"}]},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "images[0]: not an image Pillow can read (12 bytes; JPEG, PNG, ...)",
    ),
    (
        {"input": "images", "datatype": "BYTES", "images": [{"text": ""}]},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "images[0] is empty",
    ),
    (
        {"input": "images", "datatype": "BYTES", "zeros": {"shape": [0], "dtype": "object"}},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "input 'images' holds no images",
    ),
    (
        {"input": "images", "datatype": "BYTES", "images": [{"text": "x"}] * (MAX_BATCH + 1)},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "input 'images' holds 9 images: this server takes at most 8 per request (--max-batch)",
    ),
    (
        {"input": "photo", "datatype": "BYTES", "images": [{"text": "x"}]},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "input 'photo': this model takes 'images' (BYTES, encoded images) or 'data' (FP32 "
        "[n, 3, 32, 32])",
    ),
    (  # above --max-request-mb
        {"input": "images", "datatype": "BYTES", "images": [{"text": "x" * (7 << 20)}]},
        ("413", "StatusCode.RESOURCE_EXHAUSTED"),
        re.compile(
            r"request of \d+ bytes: this server takes at most 6291456 \(--max-request-mb\)"
            r"|SERVER: Received message larger than max \(\d+ vs. 6291456\)"
        ),
    ),
    (
        {"input": "images", "datatype": "BYTES", "images": [{"text": "x"}], "model": "nope"},
        ("404", "StatusCode.NOT_FOUND"),
        "Model with name nope does not exist.",
    ),
    (
        {"input": "images", "datatype": "BYTES", "images": [{"text": "x"}], "top_k": 11},
        ("400", "StatusCode.INVALID_ARGUMENT"),
        "parameter top_k=11: must be a whole number from 1 to 10 (the model's classes)",
    ),
]


def test_a_bad_request_gets_one_line_and_the_server_goes_on(server, serving_python, fmnist_root):
    """Each bad request over REST and gRPC: a 4xx or the gRPC status, one line naming the
    problem; bodies that are no request (none, not JSON) over plain HTTP; the server logs
    each in one line, no traceback, and answers the next request."""
    calls = [
        dict(request, op="infer", protocol=protocol)
        for request, _, _ in BAD_REQUESTS
        for protocol in ("http", "grpc")
    ]
    image = os.path.join(
        fmnist_root, "val", "bag", sorted(os.listdir(os.path.join(fmnist_root, "val", "bag")))[0]
    )
    good = {"op": "infer", "protocol": "grpc", "input": "images", "datatype": "BYTES"}
    results = server.ask(calls + [dict(good, images=[{"file": image}])], serving_python)
    assert len(results) == 2 * len(BAD_REQUESTS) + 1
    for (request, statuses, message), calls in zip(BAD_REQUESTS, zip(*[iter(results)] * 2)):
        assert len(statuses) == len(calls) == 2
        for status, call in zip(statuses, calls):
            (answer,) = call["answers"]
            assert answer["status"] == status, (request, answer)
            if isinstance(message, str):
                assert answer["message"] == message, answer
            else:
                assert message.fullmatch(answer["message"]), answer
    assert len(results[-1]["answers"][0]["top_classes"][0]) == 5
    assert http_status(server.http_port, f"/v2/models/{MODEL}/infer", b"") == (
        400,
        b'{"error":"the request has no body: send a v2 inference request (JSON)"}',
    )
    status, body = http_status(server.http_port, f"/v2/models/{MODEL}/infer", b"{")
    assert status == 400 and json.loads(body)["error"].startswith("the body is not JSON (")
    for content_type in ("application/json", "application/x-www-form-urlencoded"):  # curl -d
        status, body = http_status(
            server.http_port, f"/v2/models/{MODEL}/infer", b'{"inputs": 3}', content_type
        )
        message = json.loads(body)["error"]  # pydantic's words: a valid list, or array
        assert status == 400 and re.fullmatch(
            r"not a v2 inference request: inputs: Input should be a valid (list|array)", message
        )
    assert http_status(server.http_port, "/v2/health/ready") == (200, b'{"ready":true}')
    log = server.output()
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:3000]
    # a second server on a port the first holds: one line, before anything loads
    taken = subprocess.run(
        [
            serving_python,
            "-m",
            "paddle_resnet.commands.serve",
            "--http-port",
            str(server.http_port),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (taken.returncode, taken.stderr) == (
        2,
        f"error: --http-port {server.http_port}: Address already in use: choose another port\n",
    )
    assert log.count("WARNING") >= 2 * len(BAD_REQUESTS) and "refused: images[0] is empty" in log


def png_bytes(image):
    encoded = io.BytesIO()
    image.save(encoded, "PNG")
    return encoded.getvalue()


def log_since(server, start):
    """The server's log from character ``start`` on, checked for tracebacks."""
    log = server.output()[start:]
    assert "Traceback" not in log, log[log.find("Traceback") - 500 :][:3000]
    return log


def answers_a_good_request(server, fmnist_root):
    """The server still answers: a validation JPEG in v2 JSON gets its top classes."""
    bags = os.path.join(fmnist_root, "val", "bag")
    with open(os.path.join(bags, sorted(os.listdir(bags))[0]), "rb") as handle:
        image = base64.b64encode(handle.read()).decode()
    request = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [image]}]}
    status, body = http_status(
        server.http_port, f"/v2/models/{MODEL}/infer", json.dumps(request).encode()
    )
    assert status == 200, body[:2000]
    outputs = {output["name"]: output for output in json.loads(body)["outputs"]}
    assert outputs["top_classes"]["shape"] == [1, 5]


def chunked_post(port, path, chunks):
    """(status, body) of a POST whose body is ``chunks`` sent as they come, with
    Transfer-Encoding: chunked and no Content-Length (a streaming client's); the server may
    answer, and close, before it has read them all."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        try:
            connection.request("POST", path, body=chunks, encode_chunked=True)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the end: the answer is waiting
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_a_chunked_body_over_the_limit_is_refused_for_its_size(server, fmnist_root):
    """A 100 MB body streamed in 1 MB chunks without a Content-Length: 413 naming the
    limit, one line in the log, and the server goes on."""
    start = len(server.output())
    megabyte = b"A" * (1 << 20)  # one chunk, sent 100 times: the body is never in memory here

    def body():
        yield b'{"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": ["'
        for _ in range(100):
            yield megabyte
        yield b'"]}]}'

    status, answer = chunked_post(server.http_port, f"/v2/models/{MODEL}/infer", body())
    assert status == 413, answer[:2000]
    limit = MAX_REQUEST_MB << 20
    message = (
        f"request of more than {limit} bytes: this server takes at most {limit} (--max-request-mb)"
    )
    assert json.loads(answer) == {"error": message}
    assert f"refused: {message}" in log_since(server, start)
    answers_a_good_request(server, fmnist_root)


def test_an_image_is_refused_by_the_size_its_header_claims(
    server, serving_python, export, fmnist_root, tmp_path
):
    """A PNG of 12,000 x 12,000 px in one grey (about 140 KB; decoded, 144 MB) over REST and
    gRPC: refused before decoding, a 4xx naming its size, and the server goes on; the
    default limit, sized from the export's input."""
    start = len(server.output())
    path = str(tmp_path / "huge.png")
    Image.new("L", (12000, 12000), 128).save(path)
    assert 100_000 < os.path.getsize(path) < 200_000
    calls = [
        {"op": "infer", "protocol": protocol, "input": "images", "datatype": "BYTES"}
        for protocol in ("http", "grpc")
    ]
    results = server.ask([dict(call, images=[{"file": path}]) for call in calls], serving_python)
    assert len(results) == 2
    for result, status in zip(results, ("400", "StatusCode.INVALID_ARGUMENT")):
        (answer,) = result["answers"]
        assert answer["status"] == status, answer
        assert re.fullmatch(
            r"images\[0\]: an image of 12000 x 12000 px: this server decodes at most "
            r"[\d,]+ px \(--max-image-pixels\)",
            answer["message"],
        ), answer
    log_since(server, start)
    answers_a_good_request(server, fmnist_root)
    # the default: 400 times the export's input (32 x 32)
    info = exported.read_info(export.inference.model_dir)
    served = ServedExport(export.inference.model_dir, info, "openvino", "fp32", MAX_BATCH)
    assert served.max_pixels == 409_600
    with pytest.raises(UserError, match="^an image of 641 x 640 px: .* at most 409,600 px"):
        served.preprocess.decoded(png_bytes(Image.new("L", (641, 640))))
    # above Pillow's own limit: its refusal, in one line
    unlimited = ImagePreprocessing(info, max_pixels=10**10)
    with pytest.raises(
        UserError, match=r"^an image Pillow refuses to decode: Image size \(196000000"
    ):
        unlimited.decoded(png_bytes(Image.new("1", (14000, 14000))))


def test_malformed_json_items_and_headers_get_400(server, fmnist_root):
    """BYTES items that are numbers (-1, 1.5, a count of gigabytes), and an
    Inference-Header-Content-Length that is no length: 400 with one line each, no
    traceback, and the server goes on."""
    start = len(server.output())
    infer = f"/v2/models/{MODEL}/infer"
    for item in (-1, 1.5, 1 << 34):
        request = {
            "inputs": [{"name": "images", "shape": [1], "datatype": "BYTES", "data": [item]}]
        }
        status, body = http_status(server.http_port, infer, json.dumps(request).encode())
        assert (status, json.loads(body)) == (
            400,
            {"error": f"images[0] is {item}, not an encoded image (base64 text in JSON)"},
        ), body
    for length in ("abc", "-5", "999999"):
        status, body = http_status(
            server.http_port,
            infer,
            b'{"inputs": []}',
            "application/octet-stream",
            [("Inference-Header-Content-Length", length)],
        )
        assert status == 400 and json.loads(body)["error"].startswith(
            f"Inference-Header-Content-Length {length!r}: "
        ), body
    # the binary data extension: a BYTES item whose length prefix runs past the body's end
    header = {"inputs": [{"name": "images", "shape": [1], "datatype": "BYTES"}]}
    header["inputs"][0]["parameters"] = {"binary_data_size": 6}
    header = json.dumps(header).encode()
    status, body = http_status(
        server.http_port,
        infer,
        header + b"\xff\xff\xff\x7fxx",
        "application/octet-stream",
        [("Inference-Header-Content-Length", str(len(header)))],
    )
    assert status == 400 and "its data does not fit its shape [1]" in json.loads(body)["error"]
    log = log_since(server, start)
    assert log.count("refused: ") >= 7, log
    answers_a_good_request(server, fmnist_root)


def peak_rss_mb(pid):
    """The process's peak resident memory (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as handle:
        (kilobytes,) = re.findall(r"^VmHWM:\s+(\d+) kB", handle.read(), re.M)
    return int(kilobytes) / 1024


def test_schemathesis_finds_no_server_error(server, serving_python, fmnist_root, tmp_path):
    """schemathesis against the OpenAPI document the server's own FastAPI app (KServe's
    routes and v2 data models) serves, every operation on the served model's name, bounded
    in examples and time: no 5xx, no traceback in the log, and the server goes on. The
    repository extension's load and unload are left out: unloading the model is what they
    are for. Prints the server's peak memory before and after."""
    start = len(server.output())
    before = peak_rss_mb(server.process.pid)
    config = tmp_path / "schemathesis.toml"
    config.write_text(f'[parameters]\n"path.model_name" = "{MODEL}"\n')
    command = [os.path.join(SERVING, "bin", "schemathesis"), "--config-file", str(config)]
    command += ["run", f"http://127.0.0.1:{server.http_port}/openapi.json"]
    command += ["--checks", "not_a_server_error", "--max-examples", "25", "--max-time", "45"]
    command += ["--exclude-path-regex", "^/v2/repository/", "--seed", "60", "--workers", "1"]
    command += ["--request-timeout", "30", "--generation-database", "none", "--no-color"]
    fuzzed = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert fuzzed.returncode == 0, fuzzed.stdout[-6000:] + fuzzed.stderr[-2000:]
    cases = re.search(r"Test cases:\n\s*(.*)", fuzzed.stdout)
    print(  # for docs/measurements.md: pytest tests/test_serve.py -k schemathesis -s
        f"server peak RSS (VmHWM): {before:.0f} MB before schemathesis, "
        f"{peak_rss_mb(server.process.pid):.0f} MB after its "
        f"{cases.group(1) if cases else '?'}"
    )
    log_since(server, start)
    answers_a_good_request(server, fmnist_root)


def test_inference_mode_serve_without_a_serving_environment_is_one_line(export):
    """Where neither this environment nor the one named has KServe: one line, status 2."""
    result = subprocess.run(
        [
            sys.executable,
            "inference.py",
            "--mode",
            "serve",
            "--inference-dir",
            export.inference.model_dir,
        ],
        cwd=ROOT,
        env=dict(os.environ, PADDLE_RESNET_SERVE_PYTHON="/nonexistent/python"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == (
        "error: inference.py --mode serve needs the optional package kserve: "
        "bash scripts/setup_serve.sh (.venv-serve)"
    )


def kserve_errors(text, python):
    """What KServe's models (tests/kserve_models.py, in the serving environment) find."""
    result = subprocess.run(
        [python, os.path.join(ROOT, "tests", "kserve_models.py")],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def pod_errors(predictor, extension_fields):
    """The predictor less KServe's own fields, as a PodSpec in Kubernetes' strict schema
    (the oldest version the cluster manifests are for, and the newest bundled)."""
    spec = {k: v for k, v in predictor.items() if k not in extension_fields}
    template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "predictor"}}
    template["template"] = {"spec": spec}
    errors = []
    for version in ("1.31", kubernetes_validate.latest_version()):
        try:
            kubernetes_validate.validate(template, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{list(err.absolute_path)} (Kubernetes {version}): {err.message}")
    return errors


def test_the_inferenceservice_manifest(serving_python):
    """scripts/cluster/kubernetes/serving/inferenceservice.yaml, offline (not applied):
    KServe's models find nothing wrong in it and a misspelled field or a mistyped value in
    a broken copy; its pod's part is a valid Kubernetes PodSpec; the pod runs as no root
    user, without privilege escalation or capabilities, under RuntimeDefault seccomp, on a
    read-only root with writable /tmp and ~/.cache; the container runs the image's
    paddle-resnet-serve with arguments that its command line takes, on the ports it lists
    and probes, with the export on a read-only volume."""
    with open(MANIFEST) as handle:
        text = handle.read()
    broken = text.replace("minReplicas", "minReplica").replace(
        "containerPort: 8081", 'containerPort: "8081"'
    )
    checked = kserve_errors(f"{text}\n---\n{broken}", serving_python)
    assert checked["errors"] == [
        [],
        [
            "InferenceService.spec.predictor: 'minReplica' is not a field of V1beta1PredictorSpec",
            "InferenceService.spec.predictor.containers[0].ports[1].containerPort: '8081' is "
            "not of type int",
        ],
    ]
    document = yaml.safe_load(text)
    predictor = document["spec"]["predictor"]
    assert document["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    assert pod_errors(predictor, checked["extension_fields"]) == []
    bad_pod = dict(predictor, securityContext={"runAsNonRoot": "yes"})
    assert pod_errors(bad_pod, checked["extension_fields"])
    pod = predictor["securityContext"]
    (container,) = predictor["containers"]
    assert container["name"] == "kserve-container"
    assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 1000 != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    own = container["securityContext"]
    assert own["allowPrivilegeEscalation"] is False and own["capabilities"] == {"drop": ["ALL"]}
    assert own["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in predictor["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/tmp", "/home/paddle/.cache"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    # the command: the image's serving environment, and flags paddle-resnet-serve takes
    with open(os.path.join(ROOT, "Dockerfile")) as handle:
        dockerfile = handle.read()
    (program,) = container["command"]
    assert program == "/opt/venv-serve/bin/paddle-resnet-serve"
    assert "python -m venv /opt/venv-serve" in dockerfile
    assert "/opt/venv-serve/bin/pip install --no-deps -e ." in dockerfile
    config = parse("serve", container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http1": config.serve.http_port, "grpc": config.serve.grpc_port}
    assert config.serve.model_name == "rn50"
    export_mount = next(
        m for p, m in mounts.items() if config.inference.directory.startswith(p + "/")
    )
    assert export_mount["readOnly"] is True
    assert volumes[export_mount["name"]]["persistentVolumeClaim"]["readOnly"] is True
    for probe, path in (
        ("readinessProbe", "/v2/health/ready"),
        ("livenessProbe", "/v2/health/live"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": config.serve.http_port}
    # SIGTERM drains REST, then gRPC, each up to KServe's 30 s
    assert predictor["terminationGracePeriodSeconds"] > 60


def big_jpegs(folder, count, side):
    """``count`` smooth ``side`` x ``side`` JPEGs: decoding them keeps a request in flight."""
    y, x = np.mgrid[0:side, 0:side]
    paths = []
    for index in range(count):
        pixels = np.stack([(x * (index + 1)) % 256, y % 256, ((x + y) // 7) % 256], axis=-1)
        paths.append(str(folder / f"big{index}.jpg"))
        Image.fromarray(pixels.astype(np.uint8)).save(paths[-1], quality=50)
    return paths


def test_requests_sent_together_are_batched_and_sigterm_drains_the_one_in_flight(
    server, serving_python, fmnist_root, tmp_path
):
    """Last: it stops the module's server. Single-image requests sent together run
    together (the batch an answer ran in is its response's batch_size parameter); a SIGTERM
    while a request of large images is being decoded lets that request finish with its
    whole answer, then the process that was started as inference.py --mode serve (the same
    process) exits 0."""
    coats = os.path.join(fmnist_root, "val", "coat")
    small = sorted(os.path.join(coats, name) for name in os.listdir(coats))[:MAX_BATCH]
    big = big_jpegs(tmp_path, MAX_BATCH, 3000)
    images = {"input": "images", "datatype": "BYTES"}
    sigterm = {"pid": server.process.pid, "after": 0.2}
    together, in_flight = server.ask(
        [
            dict(
                images,
                op="infer",
                protocol="http",
                images=[{"file": f} for f in small],
                sizes=[1] * MAX_BATCH,
                concurrent=True,
            ),
            dict(
                images,
                op="infer",
                protocol="grpc",
                images=[{"file": f} for f in big],
                sigterm=sigterm,
            ),
        ],
        serving_python,
    )
    assert server.process.wait(timeout=120) == 0, server.output()[-3000:]
    assert [len(answer["top_classes"]) for answer in together["answers"]] == [1] * MAX_BATCH
    assert max(answer["batch_size"] for answer in together["answers"]) > 1
    (answer,) = in_flight["answers"]
    assert len(answer["top_classes"]) == answer["batch_size"] == MAX_BATCH  # in full,
    assert answer["finished_at"] > in_flight["sigterm_at"]  # after the SIGTERM
    log = server.output()
    assert "Shutting down" in log and re.search(r"stopped: \d+ images served", log), log[-2000:]
