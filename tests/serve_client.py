"""The clients of tests/test_serve.py: tritonclient (the reference Open Inference Protocol
client, http and grpc), run in the serving environment (.venv-serve: tritonclient needs
the protobuf of KServe, not Paddle 2.6's). Reads a plan from stdin, prints one JSON result
per call:

    {"http": "localhost:PORT", "grpc": "localhost:PORT", "model": NAME, "calls": [
        {"op": "health", "protocol": "http"},
        {"op": "metadata", "protocol": "grpc"},
        {"op": "infer", "protocol": "http", "input": "images", "datatype": "BYTES",
         "images": [{"file": PATH} | {"text": "not an image"}, ...] | "npy": PATH
         | "zeros": {"shape": [...], "dtype": "int32"},
         "sizes": [n, ...] (requests of n each; default one), "concurrent": bool,
         "top_k": k, "model": other name, "sigterm": {"pid": PID, "after": SECONDS}},
    ]}

An infer call answers {"answers": [per request: its outputs, or the error {"status",
"message"}; and when it came, "finished_at"], "sigterm_at"}: with "sigterm" it sends SIGTERM
to PID that many seconds after its requests went out (times: time.monotonic())."""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpc_client
import tritonclient.http as http_client
from tritonclient.utils import InferenceServerException

CLIENTS = {"http": http_client, "grpc": grpc_client}


def client(plan, protocol):
    return CLIENTS[protocol].InferenceServerClient(plan[protocol])


def health(plan, call):
    server = client(plan, call["protocol"])
    return {
        "live": server.is_server_live(),
        "ready": server.is_server_ready(),
        "model_ready": server.is_model_ready(plan["model"]),
    }


def metadata(plan, call):
    found = client(plan, call["protocol"]).get_model_metadata(plan["model"])
    if call["protocol"] == "http":
        return found
    return {
        "name": found.name,
        "platform": found.platform,
        "inputs": [tensor_metadata(t) for t in found.inputs],
        "outputs": [tensor_metadata(t) for t in found.outputs],
    }


def tensor_metadata(tensor):
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def payload(call):
    """The array the call sends, all requests' together."""
    if "images" in call:
        items = [
            open(item["file"], "rb").read() if "file" in item else item["text"].encode()
            for item in call["images"]
        ]
        return np.array(items, dtype=np.object_)
    if "npy" in call:
        return np.load(call["npy"])
    zeros = call["zeros"]
    return np.zeros(zeros["shape"], dtype=zeros["dtype"])


def batch_size(result):
    """The response's batch_size parameter: how many images ran in its request's batch."""
    response = result.get_response()
    if isinstance(response, dict):  # http
        return response["parameters"]["batch_size"]
    return response.parameters["batch_size"].int64_param


def answer(result):
    return {
        "batch_size": batch_size(result),
        "probabilities": result.as_numpy("probabilities").tolist(),
        "top_classes": [[name.decode() for name in row] for row in result.as_numpy("top_classes")],
        "top_probabilities": result.as_numpy("top_probabilities").tolist(),
    }


def refusal(error):
    return {"status": str(error.status()), "message": error.message()}


def infer(plan, call):
    module = CLIENTS[call["protocol"]]
    array = payload(call)
    sizes = call.get("sizes") or [len(array)]
    parameters = {"top_k": call["top_k"]} if "top_k" in call else None
    requests, start = [], 0
    for size in sizes:
        part = array[start : start + size]
        start += size
        tensor = module.InferInput(call["input"], list(part.shape), call["datatype"])
        tensor.set_data_from_numpy(part)
        requests.append(tensor)
    model = call.get("model", plan["model"])
    results = [None] * len(requests)

    def send(index):  # a client of its own: a connection each, as separate clients have
        try:
            server = client(plan, call["protocol"])
            found = server.infer(model, [requests[index]], parameters=parameters)
            results[index] = answer(found)
        except InferenceServerException as err:
            results[index] = refusal(err)
        results[index]["finished_at"] = time.monotonic()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    one_by_one = not call.get("concurrent") and "sigterm" not in call
    for thread in threads:
        thread.start()
        if one_by_one:
            thread.join()
    sigterm_at = None
    if "sigterm" in call:
        time.sleep(call["sigterm"]["after"])
        sigterm_at = time.monotonic()
        os.kill(call["sigterm"]["pid"], signal.SIGTERM)
    for thread in threads:
        thread.join()
    return {"answers": results, "sigterm_at": sigterm_at}


OPERATIONS = {"health": health, "metadata": metadata, "infer": infer}


def main():
    plan = json.load(sys.stdin)
    results = [OPERATIONS[call["op"]](plan, call) for call in plan["calls"]]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
