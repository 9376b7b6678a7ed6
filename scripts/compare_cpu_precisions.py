"""How often oneDNN bf16 picks the same top-1 class as fp32, over a whole validation tree.

    .venv/bin/python scripts/compare_cpu_precisions.py inference/resnet18_demo demo_data/fashion_mnist_demo

Prints the agreement, both top-1 accuracies and the largest fp32 / bf16 probability
gap; writes them to --output (JSON).
"""

from paddle_resnet.core import bootstrap

bootstrap.prepare_process()  # first: the environment Paddle reads, set before it loads
# ruff: noqa: E402  (the imports below come after that first step)

import argparse
import json
import sys

import numpy as np

from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import exit_status
from paddle_resnet.data.dali import open_split
from paddle_resnet.deploy import dali_input, inference_modes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("image_root")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--output", default="compare_cpu_precisions.json")
    args = parser.parse_args()

    def classifier(precision):
        config = build_config(
            {
                "inference.model_dir": args.model_dir,
                "inference.cpu_precision": precision,
                "inference.backend": "cpu",
            }
        )
        return inference_modes.build_classifier(config, args.batch_size)

    (fp32, info, _), (bf16, _, _) = classifier("fp32"), classifier("bf16")
    config = build_config({"data.image_root": args.image_root, "data.batch_size": args.batch_size})
    labels, top_fp32, top_bf16, gap = [], [], [], 0.0
    for batch in dali_input.validation_batches(open_split(config.data, "val"), config.data, info):
        p32, p16 = fp32(batch[feeds.IMAGE]), bf16(batch[feeds.IMAGE])
        labels.append(batch[feeds.LABEL].ravel())
        top_fp32.append(p32.argmax(1))
        top_bf16.append(p16.argmax(1))
        gap = max(gap, float(np.abs(p32 - p16).max()))
    labels, top_fp32, top_bf16 = map(np.concatenate, (labels, top_fp32, top_bf16))
    result = {
        "images": int(len(labels)),
        "top1_agreement": float((top_fp32 == top_bf16).mean()),
        "fp32_top1": float((top_fp32 == labels).mean()),
        "bf16_top1": float((top_bf16 == labels).mean()),
        "max_probability_gap": gap,
    }
    print(json.dumps(result, indent=1))
    with open(args.output, "w") as handle:
        json.dump(
            dict(result, model_dir=args.model_dir, image_root=args.image_root), handle, indent=1
        )


if __name__ == "__main__":
    sys.exit(exit_status(main))
