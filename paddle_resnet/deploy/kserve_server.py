"""KServe's ModelServer (kserve 0.21: the Open Inference Protocol over REST and gRPC) serving
an export, with what the toolkit adds, each where KServe takes it:

- the model: a ``kserve.Model`` that reads a request through ``ServedExport`` and runs it
  through the ``Batcher``; ready once the warm-up has run (``serve.py``);
- its data plane: the server is ready when its models are (KServe's says ready at once), a
  model's metadata carries the export's parameters (classes, backend, precision,
  sparsity: over REST; gRPC's ModelMetadataResponse has no field for them, its platform
  names backend and precision), and REST's binary data extension keeps a BYTES input as
  bytes: KServe 0.21 turns every binary input into JSON values, which fails on bytes that
  are not UTF-8 (an encoded image: a 500) and makes a float tensor a Python list;
- a limit on a request's size (413 over REST, gRPC's own RESOURCE_EXHAUSTED);
- the server's log: a refused request is one line, not KServe's traceback; KServe's lines
  per request only with --verbose.

kserve is optional (``core/optional.py``): the classes are made once it is imported."""

import asyncio
import json
import logging
import warnings

from paddle_resnet.core.optional import require
from paddle_resnet.deploy.open_inference import RequestError

PURPOSE = "paddle-resnet-serve"
# the response's parameter naming how many images the batch its request ran in held
BATCH_SIZE = "batch_size"


def _refusal(status, message):
    """An ASGI app answering ``status`` with KServe's error body."""

    async def respond(scope, receive, send):
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return respond


class BodyLimit:
    """ASGI middleware: a request whose Content-Length exceeds ``limit`` bytes is answered
    413 before its body is read."""

    def __init__(self, app, limit):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if length.isdigit() and int(length) > self.limit:
                message = (
                    f"request of {int(length)} bytes: this server takes at most "
                    f"{self.limit} (--max-request-mb)"
                )
                return await _refusal(413, message)(scope, receive, send)
        return await self.app(scope, receive, send)


def quiet_refusals(client_errors, not_ready):
    """A logging filter for KServe's records of its answers: a refused request (an
    exception in ``client_errors``) becomes one warning line without its traceback; a "not
    ready" (``not_ready``: a readiness probe during the warm-up) one line of information."""

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
    """One line for a REST body that is no v2 request (the validation ``errors`` of
    pydantic, as FastAPI gives them or not)."""
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


def binary_request(kserve, body, json_length, model_name):
    """A REST request in the binary data extension's form (a JSON header of
    ``json_length`` bytes, then each binary input's bytes) as KServe's InferRequest, its
    binary inputs kept as the bytes they are."""
    infer_type = require("kserve.protocol.infer_type", PURPOSE)
    invalid = require("kserve.errors", PURPOSE).InvalidInput
    try:
        header = json.loads(body[:json_length])
        inputs, raw, offset = [], [], json_length
        for item in header["inputs"]:
            parameters = item.get("parameters") or {}
            tensor = kserve.InferInput(item["name"], item["shape"], item["datatype"], parameters)
            if "binary_data_size" in parameters:
                end = offset + parameters["binary_data_size"]
                if end > len(body):
                    raise ValueError(f"input {item['name']!r} is cut short")
                raw.append(body[offset:end])
                offset = end
            else:
                tensor.data = item["data"]
                raw.append(None)  # JSON values: no raw bytes
            inputs.append(tensor)
        outputs = [
            infer_type.RequestedOutput(output["name"], output.get("parameters"))
            for output in header.get("outputs") or ()
        ]
    except (ValueError, KeyError, TypeError) as err:
        raise invalid(f"not a request of the binary data extension ({err})") from None
    return kserve.InferRequest(
        model_name,
        inputs,
        request_id=header.get("id"),
        raw_inputs=raw if any(part is not None for part in raw) else None,
        parameters=header.get("parameters"),
        request_outputs=outputs or None,
    )


def model_server(kserve, served, batcher, settings, verbose):
    """(KServe's ModelServer with the model registered, not ready yet; the model)."""
    dataplane = require("kserve.protocol.dataplane", PURPOSE)
    errors = require("kserve.errors", PURPOSE)
    infer_type = require("kserve.protocol.infer_type", PURPOSE)
    server_module = require("kserve.model_server", PURPOSE)
    header_name = require("kserve.constants.constants", PURPOSE).INFERENCE_CONTENT_LENGTH_HEADER
    v2_datamodels = require("kserve.protocol.rest.v2_datamodels", PURPOSE)

    class ExportModel(kserve.Model):
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
            return served.inputs()

        def get_output_types(self):
            return served.outputs()

        async def predict(self, request, headers=None):
            try:
                k = served.top_k(infer_type.to_http_parameters(request.parameters or {}))
                kind, data = served.request_images(request.inputs)
                if kind == "encoded":  # decoded off the event loop: Pillow lets go of the GIL
                    loop = asyncio.get_running_loop()
                    data = await loop.run_in_executor(None, served.decode, data)
                probabilities, batch_size = await batcher(data)
            except RequestError as err:
                raise errors.InvalidInput(str(err)) from None
            outputs = []
            for name, datatype, array in served.outputs_of(probabilities, k):
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
            return dict(metadata, platform=served.platform, parameters=served.parameters)

        def decode_inference_request(self, body, headers, model_name):
            if not isinstance(body, bytes):
                return super().decode_inference_request(body, headers, model_name)
            if header_name in headers:
                return binary_request(kserve, body, int(headers[header_name]), model_name)
            try:  # JSON sent as another content type (curl -d): read as JSON
                request = v2_datamodels.InferenceRequest.model_validate_json(body)
            except ValueError as err:  # pydantic's ValidationError
                raise errors.InvalidInput(describe_malformed(err.errors())) from None
            return super().decode_inference_request(request, headers, model_name)

    fastapi_exceptions = require("fastapi.exceptions", PURPOSE)
    responses = require("fastapi.responses", PURPOSE)
    kserve_logging = require("kserve.logging", PURPOSE)
    # KServe's loggers with their own handlers: Paddle's import gave the root logger one
    # that writes into the buffer bootstrap.paddle_chatter hid Paddle's prints in
    kserve_logging.configure_logging(kserve_logging.KSERVE_LOG_CONFIG)
    limit = int(settings.max_request_mb * 2**20)
    server_module.args.grpc_max_receive_message_length = limit  # KServe's own flag
    server = kserve.ModelServer(
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
        enable_latency_logging=verbose,
    )
    server.dataplane = ExportDataPlane(model_registry=server.registered_models)
    app = server_module.app
    app.add_middleware(BodyLimit, limit=limit)

    async def model_metadata(model_name: str):
        """The v2 metadata with the export's parameters (KServe's route keeps the v2
        fields only); registered before KServe's routes, so it answers first."""
        return await server.dataplane.model_metadata(model_name)

    app.add_api_route("/v2/models/{model_name}", model_metadata, methods=["GET"])

    async def malformed(request, error):
        """A body that is no v2 request: 400 and one line, as KServe answers bad input
        (FastAPI's own answer is a 422 listing its validation)."""
        message = describe_malformed(error.errors())
        kserve_logging.logger.warning("refused: %s", message)
        return responses.JSONResponse({"error": message}, status_code=400)

    app.add_exception_handler(fastapi_exceptions.RequestValidationError, malformed)
    refusals = quiet_refusals(
        (errors.InvalidInput, errors.ModelNotFound), (errors.ModelNotReady, errors.ServerNotReady)
    )
    kserve_logging.logger.addFilter(refusals)
    if not verbose:  # KServe's and uvicorn's lines per request, and FastAPI's advice to KServe
        for name in ("kserve", "kserve.trace", "uvicorn.access"):
            logging.getLogger(name).setLevel(logging.WARNING)
        warnings.filterwarnings("ignore", message="ORJSONResponse is deprecated")
    model = ExportModel(served.name)
    server.register_model(model)
    return server, model
