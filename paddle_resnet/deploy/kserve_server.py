"""KServe's ModelServer (kserve 0.21: the Open Inference Protocol over REST and gRPC) serving
an export, with what the toolkit adds (docs/guide.md#serve), each where KServe takes it.
KServe's own servers bind every interface and read gRPC's limit from KServe's module
globals, which nothing here writes; a refused request is one line in the log. ``serve.py``
imports this module only where kserve is installed."""

import asyncio
import json
import logging
import warnings
from concurrent import futures

from PIL import Image

from paddle_resnet.core.optional import require
from paddle_resnet.deploy.open_inference import RequestError

PURPOSE = "paddle-resnet-serve"
kserve = require("kserve", PURPOSE)
aio = require("grpc.aio", PURPOSE)
constants = require("kserve.constants.constants", PURPOSE)
dataplane = require("kserve.protocol.dataplane", PURPOSE)
errors = require("kserve.errors", PURPOSE)
grpc_interceptors = require("kserve.protocol.grpc.interceptors", PURPOSE)
grpc_servicer = require("kserve.protocol.grpc.servicer", PURPOSE)
grpc_services = require("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc", PURPOSE)
grpc_server = require("kserve.protocol.grpc.server", PURPOSE)
infer_type = require("kserve.protocol.infer_type", PURPOSE)
kserve_logging = require("kserve.logging", PURPOSE)
rest_server = require("kserve.protocol.rest.server", PURPOSE)
v2_datamodels = require("kserve.protocol.rest.v2_datamodels", PURPOSE)
fastapi_exceptions = require("fastapi.exceptions", PURPOSE)
app = require("kserve.model_server", PURPOSE).app  # KServe's FastAPI app, its REST routes
responses = require("fastapi.responses", PURPOSE)
TimingMiddleware = require("timing_asgi", PURPOSE).TimingMiddleware
uvloop = require("uvloop", PURPOSE)  # KServe's uvicorn[standard] brings it

# the response's parameter naming how many images the batch its request ran in held
BATCH_SIZE = "batch_size"
# the binary data extension's header: the length of the JSON before the binary inputs
JSON_LENGTH_HEADER = "Inference-Header-Content-Length"
# KServe's gRPC server listens on [::] (every interface, IPv6 and IPv4), its REST on 0.0.0.0
EVERY_INTERFACE = "0.0.0.0"


def _refuse(status, message):
    """An ASGI app answering ``status`` with KServe's error body."""
    kserve_logging.logger.warning("refused: %s", message)

    async def respond(scope, receive, send):
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return respond


class BodyLimit:
    """ASGI middleware: a body of more than ``limit`` bytes is answered 413, before it is
    read where its Content-Length says so, else once that many bytes have come."""

    def __init__(self, app, limit):
        self.app = app
        self.limit = limit

    def _too_large(self, size):
        return f"{size}: this server takes at most {self.limit} (--max-request-mb)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                refusal = self._too_large(f"request of {int(length)} bytes")
                return await _refuse(413, refusal)(scope, receive, send)
            return await self.app(scope, receive, send)
        messages, size = [], 0
        while not messages or messages[-1].get("more_body"):
            messages.append(await receive())
            if messages[-1]["type"] != "http.request":  # the client went away
                break
            size += len(messages[-1].get("body", b""))
            if size > self.limit:
                refusal = self._too_large(f"request of more than {self.limit} bytes")
                return await _refuse(413, refusal)(scope, receive, send)
        read = iter(messages)

        async def replay():
            return next(read, None) or await receive()

        return await self.app(scope, replay, send)


def quiet_refusals(client_errors, not_ready):
    """A logging filter: a refused request (``client_errors``) becomes one warning line
    without its traceback; a "not ready" (a probe during the warm-up) one line of information."""

    def one_line(record):
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, client_errors + not_ready):
            level = logging.WARNING if isinstance(error, client_errors) else logging.INFO
            record.msg, record.args = f"refused: {error}", ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = level, logging.getLevelName(level)
        # lowered after the logger's own check of the level: checked again here
        return logging.getLogger(record.name).isEnabledFor(record.levelno)

    return one_line


def describe_malformed(errors):
    """One line for a REST body that is no v2 request (pydantic's validation ``errors``)."""
    first = errors[0] if errors else {}
    where = tuple(first.get("loc", ()))
    while where[:1] in (("body",), ("InferenceRequest",)):  # where FastAPI found it
        where = where[1:]
    if first.get("type") == "missing" and not where:
        return "the request has no body: send a v2 inference request (JSON)"
    if first.get("type") == "json_invalid":
        return f"the body is not JSON ({first.get('ctx', {}).get('error', first.get('msg'))})"
    field = ".".join(map(str, where))
    return f"not a v2 inference request: {field}: {first.get('msg', 'malformed')}"


def json_length(value, body):
    """The binary data extension's header ``value`` (the JSON's length), checked."""
    if not (value.isascii() and value.isdigit()) or int(value) > len(body):
        raise errors.InvalidInput(
            f"{JSON_LENGTH_HEADER} {value!r}: the length of the request's JSON, a whole number "
            f"up to the body's {len(body)} bytes"
        )
    return int(value)


def binary_request(body, json_length, model_name):
    """A REST request of the binary data extension as KServe's InferRequest, its binary
    inputs kept as bytes."""
    try:
        header = json.loads(body[:json_length])
        inputs, raw, offset = [], [], json_length
        for item in header["inputs"]:
            parameters = item.get("parameters") or {}
            tensor = kserve.InferInput(item["name"], item["shape"], item["datatype"], parameters)
            if "binary_data_size" in parameters:
                size = parameters["binary_data_size"]
                if not isinstance(size, int) or not 0 <= size <= len(body) - offset:
                    raise ValueError(f"input {item['name']!r}: binary_data_size {size!r}")
                raw.append(body[offset : offset + size])
                offset += size
            else:
                tensor.data = item["data"]
                raw.append(None)  # JSON values: no raw bytes
            inputs.append(tensor)
        outputs = [
            infer_type.RequestedOutput(output["name"], output.get("parameters"))
            for output in header.get("outputs") or ()
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise errors.InvalidInput(f"not a request of the binary data extension ({err})") from None
    return kserve.InferRequest(
        model_name,
        inputs,
        request_id=header.get("id"),
        raw_inputs=raw if any(part is not None for part in raw) else None,
        parameters=header.get("parameters"),
        request_outputs=outputs or None,
    )


class ExportModel(kserve.Model):
    """The export as KServe's model: requests read by ``served``, run by ``batcher``."""

    def __init__(self, served, batcher):
        super().__init__(served.name)
        self.served, self.batcher = served, batcher

    def start(self):
        """Ready only after the warm-up (KServe's would say ready now)."""

    def load(self):
        """Ready only after the warm-up (KServe's data plane loads a model that is not
        ready when a gRPC request asks for it)."""
        return self.ready

    def stop(self):
        # unloaded at a stop: the requests in flight still finish (the batcher runs on)
        self.ready = False

    def get_input_types(self):
        return self.served.inputs()

    def get_output_types(self):
        return self.served.outputs()

    async def predict(self, request, headers=None):
        if not isinstance(request, kserve.InferRequest):  # KServe's v1 route hands a dict
            raise errors.InvalidInput("this model answers the v2 protocol: /v2/models/NAME/infer")
        try:
            k = self.served.top_k(infer_type.to_http_parameters(request.parameters or {}))
            kind, data = self.served.request_images(request.inputs)
            if kind == "encoded":  # decoded off the event loop: Pillow lets go of the GIL
                with self.batcher.arriving():
                    loop = asyncio.get_running_loop()
                    data = await loop.run_in_executor(None, self.served.decode, data)
            probabilities, batch_size = await self.batcher(data)
        except RequestError as err:
            raise errors.InvalidInput(str(err)) from None
        outputs = []
        for name, datatype, array in self.served.outputs_of(probabilities, k):
            outputs.append(kserve.InferOutput(name, list(array.shape), datatype))
            # as bytes: KServe's gRPC answer fails on an array (its truth value), and
            # turns these into JSON values for a REST answer that asks for them
            outputs[-1].set_data_from_numpy(array, binary_data=True)
        return kserve.InferResponse(
            response_id=request.id or "",
            model_name=self.name,
            infer_outputs=outputs,
            parameters={BATCH_SIZE: batch_size},
            use_binary_outputs=request.use_binary_outputs,
            requested_outputs=request.request_outputs,
        )


class ExportDataPlane(dataplane.DataPlane):
    """KServe's data plane, ready when its models are, binary inputs kept as bytes."""

    def __init__(self, model_registry, served):
        super().__init__(model_registry=model_registry)
        self.served = served

    async def get_model(self, name):
        """The model of a request, refused (503, UNAVAILABLE) before the warm-up."""
        model = self.get_model_from_registry(name)
        if not await model.healthy():
            raise errors.ModelNotReady(name)
        return model

    async def ready(self):
        models = list(self.model_registry.get_models().values())
        return bool(models) and all([await model.healthy() for model in models])

    async def model_metadata(self, model_name):
        metadata = await super().model_metadata(model_name)
        return dict(metadata, platform=self.served.platform, parameters=self.served.parameters)

    def decode_inference_request(self, body, headers, model_name):
        if not isinstance(body, bytes):
            return super().decode_inference_request(body, headers, model_name)
        header = constants.INFERENCE_CONTENT_LENGTH_HEADER
        if header in headers:
            return binary_request(body, json_length(headers[header], body), model_name)
        try:  # JSON sent as another content type (curl -d): read as JSON
            request = v2_datamodels.InferenceRequest.model_validate_json(body)
        except ValueError as err:  # pydantic's ValidationError
            raise errors.InvalidInput(describe_malformed(err.errors())) from None
        return super().decode_inference_request(request, headers, model_name)


class ExportGRPCServer(grpc_server.GRPCServer):
    """KServe's gRPC server on ``host``, taking messages of at most ``limit`` bytes
    (KServe's reads its limit from its module's command-line arguments)."""

    def __init__(self, host, limit, *args, **kwargs):
        super().__init__(*args, kwargs={}, **kwargs)
        self.host, self.limit = host, limit

    async def start(self, max_workers):
        self._server = aio.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            interceptors=(
                grpc_interceptors.LoggingInterceptor(),
                grpc_interceptors.ExceptionToStatusInterceptor(),
            ),
            options=[
                ("grpc.max_send_message_length", constants.MAX_GRPC_MESSAGE_LENGTH),
                ("grpc.max_receive_message_length", self.limit),
            ],
        )
        servicer = grpc_servicer.InferenceServicer(
            self._data_plane, self._model_repository_extension
        )
        grpc_services.add_GRPCInferenceServiceServicer_to_server(servicer, self._server)
        host = "::" if self.host == EVERY_INTERFACE else self.host
        self._server.add_insecure_port(
            f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"
        )
        await self._server.start()
        await self._server.wait_for_termination()


class ExportRESTServer(rest_server.RESTServer):
    """KServe's REST server on ``host``, its FastAPI app with the limit on a body, the
    export's metadata, and a 4xx for a body that is no v2 request or what is not served;
    KServe's timing of each request (two getrusage calls, a quarter of the event loop's
    time under load: docs/measurements.md) only where ``timed`` (--verbose shows its lines)."""

    def __init__(self, host, limit, timed, *args, **kwargs):
        super().__init__(constants.FASTAPI_APP_IMPORT_STRING, *args, **kwargs)
        self.config.host, self.limit, self.timed = host, limit, timed

    def create_application(self):
        async def model_metadata(model_name: str):
            """The v2 metadata with the export's parameters (KServe's route keeps the v2
            fields only); registered before KServe's routes, so it answers first."""
            return await self.dataplane.model_metadata(model_name)

        app.add_api_route("/v2/models/{model_name}", model_metadata, methods=["GET"])
        app.add_middleware(BodyLimit, limit=self.limit)
        super().create_application()
        if not self.timed:  # KServe's timing of each request: lines only --verbose shows
            app.user_middleware = [m for m in app.user_middleware if m.cls is not TimingMiddleware]
        # after KServe's handlers, which these replace
        app.add_exception_handler(fastapi_exceptions.RequestValidationError, _malformed)
        app.add_exception_handler(NotImplementedError, _not_served)


def _json_refusal(status, message):
    kserve_logging.logger.warning("refused: %s", message)
    return responses.JSONResponse({"error": message}, status_code=status)


async def _malformed(request, error):
    """A body that is no v2 request: 400, as KServe answers bad input (FastAPI's is a 422
    listing its validation)."""
    return _json_refusal(400, describe_malformed(error.errors()))


async def _not_served(request, error):
    """What KServe's routes do not implement (a model version, an explainer): 404, as a
    model of that name would be (KServe's is a 501 and a traceback)."""
    return _json_refusal(404, f"{request.url.path}: {error}")


class ExportServer(kserve.ModelServer):
    """KServe's ModelServer serving ``model`` on --host, taking at most --max-request-mb."""

    def __init__(self, model, served, settings, verbose):
        super().__init__(
            http_port=settings.http_port,
            grpc_port=settings.grpc_port,
            enable_latency_logging=verbose,
        )
        self.host, self.limit = settings.host, int(settings.max_request_mb * 2**20)
        self.dataplane = ExportDataPlane(self.registered_models, served)
        self.register_model(model)

    def start(self):
        """KServe's ``start`` with one REST process, its servers given the host and limit."""
        shared = (self.dataplane, self.model_repository_extension)
        self._rest_server = ExportRESTServer(
            self.host,
            self.limit,
            self.enable_latency_logging,
            *shared,
            self.http_port,
            grace_period=self.grace_period,
            timeout_keep_alive=self.timeout_keep_alive,
        )
        self._grpc_server = ExportGRPCServer(
            self.host, self.limit, self.grpc_port, *shared, grace_period=self.grace_period
        )
        self.servers = [self._rest_server.start(), self._grpc_server.start(self.max_threads)]
        self.setup_event_loop()
        self.register_signal_handler()
        # uvloop, as uvicorn itself runs where it is installed (KServe runs its servers in
        # asyncio's own loop): a quarter more requests a second under load (docs/measurements.md)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._serve())


def configure_logging(verbose):
    """KServe's loggers with their own handlers (Paddle's import gave the root logger one
    that writes into the buffer bootstrap.paddle_chatter hid Paddle's prints in)."""
    kserve_logging.configure_logging(kserve_logging.KSERVE_LOG_CONFIG)
    refusals = quiet_refusals(
        (errors.InvalidInput, errors.ModelNotFound), (errors.ModelNotReady, errors.ServerNotReady)
    )
    kserve_logging.logger.addFilter(refusals)
    # the size an image's header claims is checked against --max-image-pixels right after
    # Pillow's own check, which warns in two lines above 89 M px
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    if not verbose:  # KServe's and uvicorn's lines per request, and FastAPI's advice to KServe
        for name in ("kserve", "kserve.trace", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")


def model_server(served, batcher, settings, verbose):
    """(KServe's ModelServer serving ``served`` through ``batcher``, not ready yet; its model)."""
    configure_logging(verbose)
    model = ExportModel(served, batcher)
    return ExportServer(model, served, settings, verbose), model
