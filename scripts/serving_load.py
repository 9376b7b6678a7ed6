"""The load of scripts/benchmark_serving.py: tritonclient's asyncio clients (the reference
Open Inference Protocol client, gRPC and REST) keeping a fixed number of requests in flight
against a running paddle-resnet-serve, one image per request. Runs in the serving
environment (tritonclient needs KServe's protobuf), started once and asked for slices over
its standard input and output (as ``core/interleave.SliceWorker`` workers are):

    .venv-serve/bin/python scripts/serving_load.py --grpc 127.0.0.1:8081 --http 127.0.0.1:8080 \\
        --model resnet50 --shape 3,224,224 --jpegs a.jpg,b.jpg
    {"protocol": "grpc", "input": "tensor", "concurrency": 8, "seconds": 3, "max_requests": 5000}

Each slice answers its requests and images per second, the latency percentiles (each
request from sent to answered) and the mean size of the batches the server ran them in
(its answers' batch_size parameter). A slice ends at its seconds or its request bound,
whichever comes first; the requests in flight then finish and count."""

import argparse
import asyncio
import json
import sys
import time

import numpy as np
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

CLIENTS = {"grpc": grpc_aio, "http": http_aio}


def batch_size(result):
    response = result.get_response()
    if isinstance(response, dict):  # http
        return response["parameters"]["batch_size"]
    return response.parameters["batch_size"].int64_param


class Load:
    def __init__(self, args):
        self.args = args
        self.clients = {
            protocol: CLIENTS[protocol].InferenceServerClient(url)
            for protocol, url in (("grpc", args.grpc), ("http", args.http))
        }
        rng = np.random.default_rng(0)
        tensor = rng.standard_normal([1, *args.shape]).astype(np.float32)
        jpegs = [np.array([open(path, "rb").read()], dtype=np.object_) for path in args.jpegs]
        # each request's input made once, as a client sending the same images would keep
        # them: the load's own work on the cores it shares with the server stays small
        self.prepared = {
            (protocol, kind): [self.request(protocol, name, array) for array in arrays]
            for protocol in CLIENTS
            for kind, name, arrays in (("tensor", "data", [tensor]), ("jpeg", "images", jpegs))
        }

    @staticmethod
    def request(protocol, name, array):
        datatype = "FP32" if array.dtype == np.float32 else "BYTES"
        tensor = CLIENTS[protocol].InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return [tensor]

    def inputs(self, protocol, kind, index):
        prepared = self.prepared[(protocol, kind)]
        return prepared[index % len(prepared)]

    async def slice(self, protocol, kind, concurrency, seconds, max_requests):
        client = self.clients[protocol]
        latencies, batches, errors = [], [], []
        start = time.perf_counter()
        deadline = start + seconds

        async def keep_one_in_flight():
            while time.perf_counter() < deadline and len(latencies) + len(errors) < max_requests:
                inputs = self.inputs(protocol, kind, len(latencies))
                sent = time.perf_counter()
                try:
                    result = await client.infer(self.args.model, inputs)
                except InferenceServerException as err:
                    errors.append(str(err))
                    continue
                latencies.append(time.perf_counter() - sent)
                batches.append(batch_size(result))

        await asyncio.gather(*(keep_one_in_flight() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        ms = np.array(latencies) * 1000.0
        return {
            "requests": len(latencies),
            "seconds": elapsed,
            "rps": len(latencies) / elapsed,
            "ips": len(latencies) / elapsed,  # one image per request
            "latency_ms": {
                "mean": float(ms.mean()),
                "p50": float(np.percentile(ms, 50)),
                "p99": float(np.percentile(ms, 99)),
            },
            "batch_size_mean": float(np.mean(batches)),
            "errors": len(errors),
            "first_error": errors[0] if errors else None,
        }


async def serve(args):
    load = Load(args)
    for protocol in load.clients:  # a first request over each: connections made
        await load.slice(protocol, "tensor", 1, 60.0, 1)
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        ask = json.loads(line)
        answer = await load.slice(
            ask["protocol"], ask["input"], ask["concurrency"], ask["seconds"], ask["max_requests"]
        )
        print(json.dumps(answer), flush=True)
    for client in load.clients.values():
        await client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc", required=True, help="host:port of the gRPC endpoint")
    parser.add_argument("--http", required=True, help="host:port of the REST endpoint")
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--shape", required=True, type=lambda text: [int(v) for v in text.split(",")]
    )
    parser.add_argument("--jpegs", default="", type=lambda text: [p for p in text.split(",") if p])
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
