"""Reference models for the weight-import tests, run as a separate process with PyTorch:

    python tests/torch_reference.py OUT_DIR IMAGES.npy

For each model below: random weights, batch-norm statistics set to non-trivial values,
the state dict saved as its source saves it (torchvision: ``torch.save`` to ``.pth``;
timm: safetensors, its hub format), and the eval-mode logits of IMAGES (float32 NCHW,
already normalised) saved as ``<name>.logits.npy``.
"""

import os
import sys
import types

import numpy as np
import torch

# torchvision's wheel on PyPI is built against CUDA PyTorch: its C++ operators (NMS,
# RoIAlign, ...) cannot load into the CPU build, and the module that registers their
# fake kernels fails at import. The ResNets use none of them.
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
import timm  # noqa: E402
import torchvision  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

MODELS = {
    "torchvision_resnet50": (lambda: torchvision.models.resnet50(), ".pth"),
    "torchvision_resnet18": (lambda: torchvision.models.resnet18(), ".pth"),
    "torchvision_resnext50_32x4d": (lambda: torchvision.models.resnext50_32x4d(), ".pth"),
    "timm_resnet50": (lambda: timm.create_model("resnet50"), ".safetensors"),
    "torchvision_resnet18_10_classes": (
        lambda: torchvision.models.resnet18(num_classes=10),
        ".pth",
    ),
}


def randomise_batch_norms(model, generator):
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            channels = module.num_features
            # scales below 1, so the signal does not grow block by block
            module.running_mean.copy_(0.05 * torch.randn(channels, generator=generator))
            module.running_var.copy_(0.5 + torch.rand(channels, generator=generator))
            module.weight.data.copy_(0.4 + 0.5 * torch.rand(channels, generator=generator))
            module.bias.data.copy_(0.05 * torch.randn(channels, generator=generator))


def main(out_dir, images_path):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    images = torch.from_numpy(np.load(images_path))
    for name, (build, extension) in MODELS.items():
        model = build().eval()
        with torch.no_grad():
            randomise_batch_norms(model, generator)
            np.save(os.path.join(out_dir, name + ".logits.npy"), model(images).numpy())
        path = os.path.join(out_dir, name + extension)
        if extension == ".pth":
            torch.save(model.state_dict(), path)
        else:
            save_file(model.state_dict(), path)


if __name__ == "__main__":
    with torch.no_grad():
        main(*sys.argv[1:])
