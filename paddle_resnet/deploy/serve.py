"""Serve an exported model over the Open Inference Protocol (KServe v2), REST and gRPC.

    paddle-resnet-serve --inference-dir inference/resnet18_demo     # ports 8080, 8081
    python inference.py --inference-dir inference/resnet18_demo --mode serve

The ports open once the model is loaded; the server says it is ready (GET
/v2/health/ready) once a first inference of every batch size it runs has run. SIGTERM or
Ctrl-C: the requests in flight are answered, then the process exits 0.

The server runs in an environment of its own (``scripts/setup_serve.sh``: .venv-serve):
KServe 0.21 needs protobuf >= 6.33, Paddle 2.6 a protobuf 4 (``hand_over``)."""

import os
import signal
import socket
import sys
import threading
import time

from paddle_resnet.core import bootstrap, optional
from paddle_resnet.core.bootstrap import REPOSITORY
from paddle_resnet.core.errors import UserError, describe
from paddle_resnet.deploy import backends
from paddle_resnet.deploy.batching import Batcher
from paddle_resnet.deploy.open_inference import ServedExport

if optional.has_kserve:  # its classes subclass KServe's; inference.py hands over without it
    from paddle_resnet.deploy import kserve_server

# The interpreter ``inference.py --mode serve`` starts the server with where KServe is not
# installed beside it: this variable, else the repository's serving environment.
SERVING_PYTHON = "PADDLE_RESNET_SERVE_PYTHON"
# the module of paddle-resnet-serve, which that interpreter runs
SERVING_COMMAND = "paddle_resnet.commands.serve"


def _precision(backend, inference_config, info):
    """The precision the backend runs: its flag's, or the model's own (ONNX Runtime)."""
    if backend.model_precision:
        return "int8" if info.get("quantization") else "fp32"
    return backends.precision_of(backend, inference_config)


def _warm_up(batcher, served, model, failures, stopped):
    """The first inference of each batch size, then ready; a failure stops the server."""
    start = time.perf_counter()
    try:
        batcher.warm_up(served.input_shape)
    except Exception as err:  # the server cannot run its model: stop it, then exit with it
        if stopped.is_set():  # the server stopped first (a signal): nothing to report
            return
        failures.append(err)
        print(describe(err)[1], file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    sizes, took = ", ".join(map(str, batcher.sizes)), time.perf_counter() - start
    print(f"ready: warm-up ran batches of {sizes} in {took:.1f} s", flush=True)
    model.ready = True  # after the line: a client that finds it ready finds the line too


def check_ports(settings):
    """UserError, before anything loads, for a --host that names no address or a port in use."""
    try:
        family = socket.getaddrinfo(settings.host, None, type=socket.SOCK_STREAM)[0][0]
    except OSError as err:
        raise UserError(f"--host {settings.host}: {err.strerror}") from None
    for flag, port in (("--http-port", settings.http_port), ("--grpc-port", settings.grpc_port)):
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((settings.host, port))
            except OSError as err:
                raise UserError(f"{flag} {port}: {err.strerror}: choose another port") from None


def run(config):
    """Serve the export of ``config`` until SIGTERM or SIGINT; 0 once drained."""
    if not optional.has_kserve:
        raise optional.not_installed("kserve", "paddle-resnet-serve")
    inf, settings = config.inference, config.serve
    check_ports(settings)
    classifier, info, backend, notes = backends.build_classifier(inf, settings.max_batch)
    served = ServedExport(
        inf.directory,
        info,
        backend.name,
        _precision(backend, inf, info),
        settings.max_batch,
        settings.model_name,
        settings.max_image_pixels,
    )
    batcher = Batcher(classifier, settings.max_batch, settings.max_wait_ms / 1000)
    server, model = kserve_server.model_server(served, batcher, settings, bootstrap.verbose())
    for line in notes:
        print(line, flush=True)
    print(
        f"serving {served.name!r} ({backend.name} {served.parameters['precision']}) over "
        f"the Open Inference Protocol on {settings.host}: REST on port {settings.http_port}, "
        f"gRPC on {settings.grpc_port}; batches of up to {settings.max_batch} images, "
        f"{settings.max_wait_ms:g} ms wait; images of up to {served.max_pixels:,} px",
        flush=True,
    )
    failures, stopped = [], threading.Event()
    warm_up = (batcher, served, model, failures, stopped)
    threading.Thread(target=_warm_up, args=warm_up, daemon=True).start()
    server.start()  # returns once a SIGTERM or SIGINT has drained the requests in flight
    stopped.set()
    if failures:
        raise failures[0]
    batches = sum(batcher.batches.values())
    images = sum(size * count for size, count in batcher.batches.items())
    print(f"stopped: {images} images served in {batches} batches", flush=True)
    return 0


def serving_command(config):
    """The arguments of ``python -m paddle_resnet.commands.serve`` for ``config``."""
    inference_config, settings = config.inference, config.serve
    argv = ["--inference-dir", inference_config.directory]
    argv += ["--backend", inference_config.backend]
    argv += ["--cpu-precision", inference_config.cpu_precision]
    argv += ["--cpu-threads", str(inference_config.cpu_threads)]
    if settings.model_name:
        argv += ["--model-name", settings.model_name]
    argv += ["--host", settings.host]
    argv += ["--http-port", str(settings.http_port), "--grpc-port", str(settings.grpc_port)]
    argv += ["--max-batch", str(settings.max_batch), "--max-wait-ms", str(settings.max_wait_ms)]
    argv += ["--max-request-mb", str(settings.max_request_mb)]
    if settings.max_image_pixels:
        argv += ["--max-image-pixels", str(settings.max_image_pixels)]
    return argv + (["--verbose"] if config.run.verbose else [])


def hand_over(config):
    """``inference.py --mode serve``: this process becomes the server (the same process
    id, so a signal to it reaches the server), in the serving environment without KServe."""
    python = sys.executable
    if not optional.has_kserve:
        python = os.environ.get(
            SERVING_PYTHON, os.path.join(REPOSITORY, ".venv-serve", "bin", "python")
        )
        if not os.path.isfile(python):
            raise optional.not_installed("kserve", "inference.py --mode serve")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python, "-m", SERVING_COMMAND, *serving_command(config)])
