"""The data sections: the dataset, its augmentation and loading; the data check."""

from dataclasses import dataclass
from typing import Optional, Tuple

from paddle_resnet.core.config.keys import (
    CHECK_DATA,
    IMAGE_TOOLS,
    MODEL_TOOLS,
    SAMPLINGS,
    TRAIN_EXPORT,
    at_least,
    each,
    in_range,
    key,
    positive,
)


@dataclass(frozen=True)
class DataConfig:
    image_root: Optional[str] = key(
        None,
        "--image-root",
        "folder holding train/<class>/*.jpg and val/<class>/*.jpg "
        "(or the record files, with --data-format)",
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    format: str = key(
        "folder",
        "--data-format",
        "input format: an image tree (folder) or a record format of data/records.py "
        "(scripts/data/make_records.py writes them)",
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    batch_size: int = key(
        256,
        "--batch-size",
        "images per device per step (training and evaluation)",
        at_least(1),
        tools=MODEL_TOOLS,
    )
    seed: int = key(42, "--dali-random-seed", "seed of DALI shuffling and augmentation")
    output_fp16: bool = key(
        False,
        "--dali-output-fp16",
        "DALI outputs fp16 images (pure fp16 training reads them as they are; otherwise the "
        "program casts them to fp32)",
    )
    num_threads: int = key(
        0,
        "--dali-num-threads",
        "DALI threads per process (0: all cores)",
        at_least(0),
        resume_may_change=True,
        tools=IMAGE_TOOLS,
    )
    crop_size: int = key(
        224,
        "--crop-size",
        "side of the square network input",
        at_least(8),
        tools=TRAIN_EXPORT + CHECK_DATA,
    )
    resize_short: int = key(
        256,
        "--resize-short",
        "validation: shorter side before the centre crop",
        at_least(8),
        tools=TRAIN_EXPORT,
    )
    rand_crop_scale: Tuple[float, float] = key(
        (0.08, 1.0),
        "--rand-crop-scale",
        "training crop area range, e.g. 0.08,1",
        lambda v: None if 0 < v[0] <= v[1] <= 1 else f"must satisfy 0 < min <= max <= 1, got {v}",
    )
    rand_crop_ratio: Tuple[float, float] = key(
        (3.0 / 4.0, 4.0 / 3.0),
        "--rand-crop-ratio",
        "training crop aspect-ratio range, e.g. 0.75,1.333",
        lambda v: None if 0 < v[0] <= v[1] else f"must satisfy 0 < min <= max, got {v}",
    )
    sampling: str = key(
        "shuffle",
        "--sampling",
        "training images of an epoch: shuffle (each image once) or class-balanced (every "
        "class drawn equally often: a rare class's images repeat, a common one's are "
        "fewer; the epoch keeps its length; image trees only)",
        choices=SAMPLINGS,
    )
    color_jitter: Tuple[float, float, float] = key(
        (0.0, 0.0, 0.0),
        "--color-jitter",
        "training ColorJitter strengths: brightness,contrast,saturation (e.g. 0.4,0.4,0.4)",
        each(in_range(0, 1, "[0, 1)")),
    )
    normalize_scale: float = key(
        1.0 / 255.0,
        "--normalize-scale",
        "the pixel scale that --normalize-mean and --normalize-std refer to (1/255: the 0-1 scale; "
        "1: pixel values)",
        positive,
        tools=TRAIN_EXPORT,
    )
    normalize_mean: Tuple[float, float, float] = key(
        (0.485, 0.456, 0.406),
        "--normalize-mean",
        "per-channel mean (0-1 scale)",
        tools=TRAIN_EXPORT,
    )
    normalize_std: Tuple[float, float, float] = key(
        (0.229, 0.224, 0.225),
        "--normalize-std",
        "per-channel std (0-1 scale)",
        each(positive),
        tools=TRAIN_EXPORT,
    )


@dataclass(frozen=True)
class CheckConfig:
    at_start: bool = key(
        True,
        "--data-check",
        "check an image tree at the start of a run, as paddle-resnet-check-data's fast pass "
        "does (counts, broken files, colour modes, sizes, train/val duplicates; about 0.1 ms "
        "an image), its findings printed as warnings (--no-data-check: skip it; broken "
        "images and empty class folders are refused either way)",
        resume_may_change=True,
    )
    decode: bool = key(
        False,
        "--decode",
        "paddle-resnet-check-data: also decode every image with DALI on the CPU as training "
        "does (--dali-num-threads threads), and say at what rate",
        resume_may_change=True,
        tools=CHECK_DATA,
    )
    json_path: Optional[str] = key(
        None,
        "--json",
        "paddle-resnet-check-data: also write the counts and findings to this JSON file",
        resume_may_change=True,
        tools=CHECK_DATA,
    )
