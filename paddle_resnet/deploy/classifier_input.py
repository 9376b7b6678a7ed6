"""What every backend's classifier takes: a float32 batch of the exported model's input
shape, checked before it reaches the runtime (a wrong shape is one line, not a crash
inside it)."""

import numpy as np

from paddle_resnet.core.errors import UserError


def checked_batch(images, input_shape):
    """``images`` as a contiguous float32 batch, or a UserError for another shape."""
    images = np.ascontiguousarray(images, dtype=np.float32)
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(input_shape):
        raise UserError(
            f"input of shape {tuple(images.shape)} does not fit the model, "
            f"which takes [batch, {', '.join(map(str, input_shape))}]"
        )
    return images
