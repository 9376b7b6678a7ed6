"""Encoded images (what a client sends the server) as the exported model's input,
preprocessed as the validation pipeline does it: decoded to RGB with the EXIF orientation
applied, the shorter side resized to ``resize_short`` (bilinear, antialiased when
shrinking), the centred ``crop_size`` square (its corner rounded half up, as DALI's
``crop_pos`` 0.5 places it), normalised, in the model's layout.

Pillow does it instead of DALI, so a serving machine needs no DALI. Both decode with
libjpeg-turbo (the same pixels); the resampling differs a little: before normalisation,
ImageNet photos of 257-512 px resized to 256 and cropped to 224 differed from DALI's CPU
pipeline by 0.07-0.6 of 255 per image on average (up to 19 at single pixels), Fashion-MNIST's
28 px resized to 32 by at most 1. tests/test_serve.py holds the two pipelines to that and
compares the served top-1 with ``inference.py --mode predict``'s."""

import io
import math

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from paddle_resnet.core.errors import UserError


def _half_up(value):
    return math.floor(value + 0.5)


class ImagePreprocessing:
    """Encoded image bytes -> one float32 input of the exported model; an image of more
    than ``max_pixels`` is refused before it is decoded."""

    def __init__(self, info, max_pixels=None):
        self.max_pixels = max_pixels
        pre = info["preprocess"]
        self.resize_short = pre["resize_short"]
        self.crop = pre["crop_size"]
        scale = pre.get("normalize_scale", 1.0 / 255.0)
        # as DALI's crop_mirror_normalize takes them: in 0-255 units
        self.mean = np.array(pre["normalize_mean"], np.float32) / scale
        self.std = np.array(pre["normalize_std"], np.float32) / scale
        self.layout = info["layout"]
        shape = info["input_shape"]
        self.channels = shape[0] if self.layout == "NCHW" else shape[-1]

    def decoded(self, encoded):
        """``encoded`` as an RGB image the right way up; UserError naming what is wrong."""
        try:
            image = Image.open(io.BytesIO(encoded))  # reads the header only
            width, height = image.size
            if self.max_pixels and width * height > self.max_pixels:
                raise UserError(
                    f"an image of {width} x {height} px: this server decodes at most "
                    f"{self.max_pixels:,} px (--max-image-pixels)"
                )
            return ImageOps.exif_transpose(image).convert("RGB")
        except UnidentifiedImageError:
            raise UserError(
                f"not an image Pillow can read ({len(encoded)} bytes; JPEG, PNG, ...)"
            ) from None
        except Image.DecompressionBombError as err:  # above Pillow's own limit (179 M px)
            raise UserError(f"an image Pillow refuses to decode: {err}") from None
        except (OSError, ValueError, SyntaxError, EOFError) as err:
            raise UserError(f"a damaged or unreadable image ({err})") from None

    def resized(self, image):
        """The shorter side to ``resize_short``, the aspect ratio kept (rounded half up)."""
        width, height = image.size
        ratio = self.resize_short / min(width, height)
        size = (
            (self.resize_short, _half_up(height * ratio))
            if width <= height
            else (_half_up(width * ratio), self.resize_short)
        )
        return image.resize(size, Image.BILINEAR)

    def __call__(self, encoded):
        pixels = np.asarray(self.resized(self.decoded(encoded)), dtype=np.float32)
        height, width = pixels.shape[:2]
        top, left = _half_up((height - self.crop) / 2), _half_up((width - self.crop) / 2)
        pixels = (pixels[top : top + self.crop, left : left + self.crop] - self.mean) / self.std
        if self.channels == 4:
            pixels = np.concatenate([pixels, np.zeros_like(pixels[..., :1])], axis=-1)
        return np.ascontiguousarray(
            pixels.transpose(2, 0, 1) if self.layout == "NCHW" else pixels, dtype=np.float32
        )
