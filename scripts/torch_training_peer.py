"""The PyTorch contenders of scripts/benchmark_cpu_training.py, in a process without
Paddle: ResNet v1.5 trained eagerly, fp32, or bf16 autocast with channels-last tensors
(Intel's recipe for its CPUs), and the latter compiled (``torch.compile``, Inductor's C++
kernels: PyTorch's fastest CPU training), serving slices as ``paddle_resnet/core/interleave.py``
says. Started by the benchmark; the toolkit's package is not imported (it loads Paddle),
only its interleave module, by path.
"""

import argparse
import importlib.util
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "interleave", os.path.join(ROOT, "paddle_resnet", "core", "interleave.py")
)
interleave = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(interleave)


def classes_for(size):
    """ImageNet's 1,000 classes at ImageNet sizes; the demo's 10 at its 32 px (as the
    benchmark's Paddle contenders)."""
    return 1000 if size >= 128 else 10


def torch_trainer(variant, arch, size, batch):
    """(one eager training step, trainable parameter count, what it is): ResNet v1.5, SGD
    momentum; bf16: autocast over forward and loss, channels-last tensors."""
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    model = torch_resnet(torch, arch, classes_for(size))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, classes_for(size), (batch,))
    bf16 = variant in ("torch_bf16", "torch_bf16_compiled")
    if bf16:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    forward = torch.compile(model) if variant == "torch_bf16_compiled" else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = torch.nn.functional.cross_entropy(forward(images), labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()

    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return step, count, {"torch": torch.__version__}


def torch_resnet(torch, arch, num_classes):
    """ResNet v1.5 (stride on the 3x3) in PyTorch, as torchvision defines it; written
    out because torchvision's CPU wheel is not on PyPI. Parameter counts are checked
    against the Paddle model's."""
    nn = torch.nn
    depths = {"resnet18": ("basic", [2, 2, 2, 2]), "resnet50": ("bottleneck", [3, 4, 6, 3])}
    kind, blocks = depths[arch]
    expansion = 4 if kind == "bottleneck" else 1

    def conv_bn(cin, cout, k, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
        return layers + [nn.ReLU(inplace=True)] if relu else layers

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * expansion
            if kind == "bottleneck":
                body = (
                    conv_bn(cin, width, 1)
                    + conv_bn(width, width, 3, stride)
                    + conv_bn(width, cout, 1, relu=False)
                )
            else:
                body = conv_bn(cin, width, 3, stride) + conv_bn(width, cout, 3, relu=False)
            self.body = nn.Sequential(*body)
            self.shortcut = (
                nn.Sequential(*conv_bn(cin, cout, 1, stride, relu=False))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return torch.relu(self.body(x) + self.shortcut(x))

    layers, cin = conv_bn(3, 64, 7, 2) + [nn.MaxPool2d(3, 2, 1)], 64
    for stage, count in enumerate(blocks):
        width = 64 * 2**stage
        for index in range(count):
            layers.append(Block(cin, width, 2 if index == 0 and stage > 0 else 1))
            cin = width * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--worker", choices=("torch_fp32", "torch_bf16", "torch_bf16_compiled"), required=True
    )
    parser.add_argument("--setting", required=True, help="arch:size:batch")
    args = parser.parse_args()
    arch, size, batch = args.setting.split(":")
    step, params, about = torch_trainer(args.worker, arch, int(size), int(batch))
    step()  # warm-up
    interleave.serve_slices(step, int(batch), {"parameters": params, **about})


if __name__ == "__main__":
    main()
