"""Seeded random weights from names and shapes alone, shared by the PaddleClas fixture
maker (run in PaddleClas's environment) and tests/test_weights.py."""

import numpy as np

CROP = 128  # input side of the reference images
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def imagenet_normalise(crops):
    """uint8 NHWC crops -> float32 NCHW, normalised as ImageNet models expect."""
    return np.ascontiguousarray(((crops / np.float32(255) - MEAN) / STD).transpose(0, 3, 1, 2))


def seeded_state(shapes, seed):
    """name -> float32 array for each (name, shape): He-normal convolution and FC weights,
    batch-norm scales, shifts and statistics away from their trivial values."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in shapes:
        leaf = name.rsplit(".", 1)[-1]
        if len(shape) == 4:
            value = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif len(shape) == 2:  # Paddle stores FC weights [in, out]
            value = rng.standard_normal(shape) / np.sqrt(shape[0])
        elif leaf == "_variance":
            value = rng.uniform(0.5, 1.5, shape)
        elif leaf == "weight":  # below 1, so the signal does not grow block by block
            value = rng.uniform(0.4, 0.9, shape)
        else:  # bias, _mean
            value = 0.05 * rng.standard_normal(shape)
        state[name] = value.astype(np.float32)
    return state
