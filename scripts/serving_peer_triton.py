"""A peer for paddle-resnet-serve's figures: NVIDIA's Triton Inference Server (the binary
PyTriton's wheel brings) serving the same export through the classifier paddle-resnet-serve
builds (backend auto), with Triton's own dynamic batcher and its C++ HTTP and gRPC front
ends; only the model's call is Python.
It takes FP32 tensors (input ``data``, the export's shape) and answers ``probabilities``:
the Open Inference Protocol, so one load (wrk, tritonclient) drives both servers.

    # the system's Python: PyTriton's stub for 3.11 links the system's libpython 3.11, whose
    # threading differs from another 3.11's standard library (_thread.RLock._recursion_count)
    uv venv --python /usr/bin/python3.11 /tmp/peer
    uv pip install --python /tmp/peer/bin/python nvidia-pytriton \\
        paddlepaddle==3.3.1 setuptools pyyaml pillow "numpy<2"
    PYTHONPATH=. /tmp/peer/bin/python scripts/serving_peer_triton.py \\
        --inference-dir inference/resnet18_demo --http-port 8094 --grpc-port 8095

Not part of the toolkit (PyTriton is not one of its dependencies): docs/measurements.md
"Serving" quotes what it measured."""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import os

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

from paddle_resnet.core.config import build_config
from paddle_resnet.deploy import backends


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inference-dir", required=True)
    parser.add_argument("--http-port", type=int, default=8094)
    parser.add_argument("--grpc-port", type=int, default=8095)
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    args = parser.parse_args()

    # the classifier paddle-resnet-serve builds, with its defaults (backend auto, all cores)
    config = build_config({"inference.model_dir": args.inference_dir})
    classify, info, backend, notes = backends.build_classifier(config.inference, args.max_batch)
    print(*notes, sep="\n")

    @batch
    def infer(data):
        return {"probabilities": classify(np.ascontiguousarray(data, np.float32))}

    triton_config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        allow_metrics=False,
    )
    with Triton(config=triton_config) as triton:
        triton.bind(
            model_name=os.path.basename(os.path.normpath(args.inference_dir)),
            infer_func=infer,
            inputs=[Tensor(name="data", dtype=np.float32, shape=tuple(info["input_shape"]))],
            outputs=[Tensor(name="probabilities", dtype=np.float32, shape=(-1,))],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=int(args.max_wait_ms * 1000)),
            ),
        )
        print(f"serving on 127.0.0.1: REST {args.http_port}, gRPC {args.grpc_port}", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
