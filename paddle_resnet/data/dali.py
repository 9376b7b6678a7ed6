"""DALI input pipelines: decode, augment and normalise; batches ready to feed.

On GPU machines JPEGs are decoded by nvJPEG and the batches stay on the device; on CPU
machines the same pipeline yields NumPy arrays (DALI's Paddle iterator needs a GPU).

Image trees are shuffled here, not by the DALI reader: each epoch gets its own order and
augmentation seed from (seed, epoch), so an epoch produces the same batches whether the
run started at epoch 0 or resumed before it. Record files are shuffled by DALI's reader
within a buffer of 1,024 records, over training records written in a shuffled order.
"""

import itertools
import math
import os
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline
from nvidia.dali.plugin.base_iterator import LastBatchPolicy
from nvidia.dali.plugin.paddle import DALIGenericIterator

from paddle_resnet.core import feeds
from paddle_resnet.core.bootstrap import available_cores, native_chatter, verbose
from paddle_resnet.core.class_index import CLASSES_FILE, read_class_index
from paddle_resnet.core.errors import DataError
from paddle_resnet.data import records
from paddle_resnet.data.folder import (
    ImageList,
    refuse_broken,
    scan_split,
    structurally_broken,
    unreadable_images,
)

PREFETCH_DEPTH = 2


def train_steps(num_images, batch_size, world_size):
    """Steps per training epoch: whole batches that every rank can fill."""
    steps = num_images // world_size // batch_size
    if steps == 0:
        raise DataError(
            f"{num_images} training images give no full batch of {batch_size} "
            f"per rank on {world_size} rank(s); lower --batch-size"
        )
    return steps


def train_indices(num_images, batch_size, rank, world_size, seed, epoch, labels=None):
    """This rank's images for one training epoch: shuffled (with ``labels``, drawn by
    class), whole batches only. One order per (seed, epoch), cut into disjoint shares of
    the same number of steps per rank, so collective ops never wait."""
    rng = np.random.RandomState(seed + epoch)
    order = rng.permutation(num_images) if labels is None else class_balanced_order(labels, rng)
    steps = train_steps(num_images, batch_size, world_size)
    start = rank * (num_images // world_size)  # this rank's share of the images
    return order[start : start + steps * batch_size]


def class_balanced_order(labels, rng):
    """As many draws as images, each class of ``labels`` drawn equally often, shuffled: a
    rare class's images come back, a common class gives a different subset each epoch."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    shares = np.full(len(classes), len(labels) // len(classes))
    shares[rng.permutation(len(classes))[: len(labels) % len(classes)]] += 1
    draws = []
    for label, share in zip(classes, shares):
        members = np.flatnonzero(labels == label)
        rounds = -(-share // len(members))  # ceiling
        draws.append(np.concatenate([rng.permutation(members) for _ in range(rounds)])[:share])
    return rng.permutation(np.concatenate(draws))


def eval_indices(num_images, rank, world_size):
    """This rank's contiguous share of the validation images; together, each image once."""
    return np.array_split(np.arange(num_images), world_size)[rank]


@dataclass(frozen=True)
class DataSplit:
    """One split as the loaders read it: an image tree or a record file."""

    split: str
    classes: Tuple[str, ...]
    num_images: int
    image_list: Optional[ImageList] = None  # folder format only
    # the files of ``image_list`` a screening found no decoder can read; None: not screened
    broken: Optional[Tuple[str, ...]] = None

    def __len__(self):
        return self.num_images

    def spread(self, count):
        """``count`` images evenly spaced over the split (a record file stays whole)."""
        if self.image_list is None or count >= self.num_images:
            return self
        chosen = np.linspace(0, self.num_images - 1, count).round().astype(int)
        return DataSplit.of_images(self.split, self.image_list.subset(chosen))

    @classmethod
    def of_images(cls, split, image_list):
        return cls(split, image_list.classes, len(image_list), image_list)

    def with_broken(self, broken):
        return replace(self, broken=tuple(broken))


def open_split(data_config, split):
    """Scan (folder) or check (recordio / tfrecord) ``split`` of ``data_config.image_root``."""
    if data_config.format == "folder":
        return DataSplit.of_images(split, scan_split(data_config.image_root, split))
    if not data_config.image_root or not os.path.isdir(data_config.image_root):
        raise DataError(f"record folder {data_config.image_root!r} does not exist")
    # Checking a TFRecord file reads all of it: done for validation only. A broken
    # training record is named when DALI fails on it (describe_record_error).
    check = records.check_records if split == "val" else records.count_records
    count = check(data_config.image_root, split, data_config.format)
    classes = read_class_index(os.path.join(data_config.image_root, CLASSES_FILE))
    return DataSplit(split, tuple(classes), count)


def build_pipeline(read_encoded, data_config, layout, training, seed, device_id=None, channels=3):
    """A DALI pipeline (CPU-only with ``device_id=None``) over ``read_encoded()``'s nodes."""
    cfg = data_config
    pipe = Pipeline(
        batch_size=cfg.batch_size,
        num_threads=cfg.num_threads or available_cores(),
        device_id=device_id,
        seed=seed,
        prefetch_queue_depth=PREFETCH_DEPTH,
    )
    decoder = "cpu" if device_id is None else "mixed"
    with pipe:
        encoded, labels = read_encoded()
        if training:
            images = fn.decoders.image_random_crop(
                encoded,
                device=decoder,
                output_type=types.RGB,
                random_area=list(cfg.rand_crop_scale),
                random_aspect_ratio=list(cfg.rand_crop_ratio),
                num_attempts=100,
            )
            images = fn.resize(images, resize_x=cfg.crop_size, resize_y=cfg.crop_size)
            if any(cfg.color_jitter):
                images = _color_jitter(images, *cfg.color_jitter)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=cfg.resize_short)
            mirror = 0
        # pad_output pads the channels to a power of two (4) with zeros, as NVIDIA's
        # reference does for tensor-core friendly NHWC fp16 convolutions.
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT16 if cfg.output_fp16 else types.FLOAT,
            output_layout="CHW" if layout == "NCHW" else "HWC",
            crop=(cfg.crop_size, cfg.crop_size),
            mean=[m / cfg.normalize_scale for m in cfg.normalize_mean],
            std=[s / cfg.normalize_scale for s in cfg.normalize_std],
            mirror=mirror,
            pad_output=channels == 4,
        )
        labels = fn.cast(labels, dtype=types.INT64)
        if device_id is not None:
            labels = labels.gpu()
        pipe.set_outputs(images, labels)
    pipe.build()
    return pipe


def _color_jitter(images, brightness, contrast, saturation):
    """torchvision's ColorJitter: each factor drawn from [1 - s, 1 + s] per image."""
    strengths = dict(brightness=brightness, contrast=contrast, saturation=saturation)
    factors = {name: fn.random.uniform(range=[1.0 - s, 1.0 + s]) for name, s in strengths.items()}
    return fn.color_twist(images, **factors)


class DaliLoader:
    """One pass over a pipeline's images as feed dicts, each image exactly once."""

    def __init__(self, pipe, num_images, batch_size, on_gpu, describe_failure):
        self.pipe = pipe
        self.num_images = num_images
        self.batch_size = batch_size
        self.on_gpu = on_gpu
        self.describe_failure = describe_failure

    def __len__(self):
        return math.ceil(self.num_images / self.batch_size)

    def __iter__(self):
        if self.num_images == 0:  # a rank with no validation image left
            return
        batches = self._iterate_gpu() if self.on_gpu else self._iterate_cpu()
        for step in itertools.count():
            # A failure of DALI (a decode error, a read error) is described here, on either
            # device: raised as it came, DALI's RuntimeError read as a lost peer in a
            # multi-rank run (lifecycle.peers_watched), status 75 instead of this line.
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RuntimeError as err:
                raise self.describe_failure(step, err) from None
            yield batch

    def _iterate_cpu(self):
        for step in range(len(self)):
            images, labels = self.pipe.run()
            valid = min(self.batch_size, self.num_images - step * self.batch_size)
            yield {feeds.IMAGE: images.as_array()[:valid], feeds.LABEL: labels.as_array()[:valid]}

    def _iterate_gpu(self):
        iterator = DALIGenericIterator(
            [self.pipe],
            [feeds.IMAGE, feeds.LABEL],
            size=self.num_images,
            last_batch_policy=LastBatchPolicy.PARTIAL,
        )
        for batch in itertools.islice(iterator, len(self)):
            yield batch[0]


def _folder_source(data_split, data_config, training, rank, world_size, epoch):
    """(read_encoded, describe_failure, number of images) for this rank's share of a tree."""
    image_list, broken, batch = data_split.image_list, data_split.broken, data_config.batch_size
    balanced_by = image_list.labels if data_config.sampling == "class-balanced" else None
    indices = (
        train_indices(
            len(image_list), batch, rank, world_size, data_config.seed, epoch, balanced_by
        )
        if training
        else eval_indices(len(image_list), rank, world_size)
    )
    files = [image_list.files[i] for i in indices]
    _refuse_names_not_utf8(files)
    # The whole split's screening (a run's, once per job; else here); this rank's files of
    # this epoch must be clean.
    if broken is None:
        broken = structurally_broken(image_list.files)
    refuse_broken(sorted(set(broken) & set(files)))
    # Whole batches, filled by wrapping around to the first images (cut again by the
    # loader). DALI's own padding repeats the last image, and its CPU decoder
    # crashes when dozens of samples of a batch fail, were that image broken.
    padded = np.resize(indices, math.ceil(len(indices) / batch) * batch)

    def read_encoded():
        return fn.readers.file(
            files=[image_list.files[i] for i in padded],
            labels=[image_list.labels[i] for i in padded],
            random_shuffle=False,
            name="Reader",
        )

    def describe_failure(step, err):
        # DALI names no file for a failed decode; the failing batch is this one or
        # one of those already prefetched behind it. A file the file system fails to
        # read is a RestartableError (unreadable_images).
        suspects = files[step * batch : (step + PREFETCH_DEPTH + 1) * batch]
        broken = next(unreadable_images(suspects), None)
        if broken:
            return DataError(f"{broken}: cannot be decoded as an image")
        return DataError(
            f"DALI could not decode or read an image of batch {step + 1} of this rank, which "
            f"Pillow decodes ({dali_reason(err)}); one of {len(suspects)} images from "
            f"{suspects[0] if suspects else '?'}: paddle-resnet-check-data --decode names it"
        )

    return read_encoded, describe_failure, len(files)


def _refuse_names_not_utf8(files):
    """DALI's file reader takes UTF-8 names only: one that is not (os.listdir gives its
    bytes as surrogate escapes) ended the run in DALI's "Unsupported argument type"."""
    for path in files:
        if not path.isascii():
            try:
                path.encode()
            except UnicodeEncodeError:
                raise DataError(
                    f"{path!r}: its name is not UTF-8, which DALI's file reader cannot "
                    "take: rename it (convmv converts names to UTF-8)"
                ) from None


def _record_source(data_split, data_config, training, rank, world_size, seed):
    """(read_encoded, describe_failure, number of images) for this rank's shard of a record file."""
    fmt, root, batch = data_config.format, data_config.image_root, data_config.batch_size
    split = data_split.split
    if training:
        num_images = batch * train_steps(len(data_split), batch, world_size)
    else:
        num_images = len(records.shard_range(len(data_split), rank, world_size))
    return (
        lambda: read_records(
            root, split, fmt, rank, world_size, random_shuffle=training, seed=seed
        ),
        lambda step, err: describe_record_error(err, root, split, fmt),
        num_images,
    )


def make_loader(
    data_split,
    data_config,
    layout,
    training,
    rank=0,
    world_size=1,
    epoch=0,
    device_id=None,
    channels=3,
):
    """The loader of one epoch (training) or one full pass (evaluation) for this rank."""
    seed = data_config.seed + 1000 * epoch + rank
    if data_split.image_list is not None:
        source = _folder_source(data_split, data_config, training, rank, world_size, epoch)
    else:
        source = _record_source(data_split, data_config, training, rank, world_size, seed)
    read_encoded, describe_failure, num_images = source
    pipe = None
    if num_images:
        pipe = build_pipeline(
            read_encoded, data_config, layout, training, seed, device_id, channels
        )
    return DaliLoader(
        pipe, num_images, data_config.batch_size, device_id is not None, describe_failure
    )


DECODE_BATCH = 64


def _decoder(num_threads):
    """A CPU pipeline decoding the encoded images fed to it, as the validation pipeline
    decodes (fn.decoders.image to RGB); synchronous, so a failure is the batch just fed."""
    pipe = Pipeline(
        batch_size=DECODE_BATCH,
        num_threads=num_threads,
        device_id=None,
        exec_async=False,
        exec_pipelined=False,
        prefetch_queue_depth=1,
    )
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        pipe.set_outputs(fn.decoders.image(encoded, device="cpu", output_type=types.RGB))
    pipe.build()
    return pipe


def _decoded(pipe, batch):
    """Whether ``pipe`` decodes every (key, encoded bytes) of ``batch``."""
    pipe.feed_input("encoded", [np.frombuffer(data, dtype=np.uint8) for _, data in batch])
    try:
        with native_chatter(verbose()):
            pipe.run()
        return True
    except RuntimeError:
        return False


def undecodable(samples, num_threads):
    """The keys of the (key, encoded bytes) ``samples`` that DALI's CPU decoder fails on;
    a failed batch is decoded again image by image to name the failing ones."""
    samples = iter(samples)
    pipe = _decoder(num_threads)
    for batch in iter(lambda: list(itertools.islice(samples, DECODE_BATCH)), []):
        if _decoded(pipe, batch):
            continue
        pipe = _decoder(num_threads)  # a failed pipeline is no longer valid
        for sample in batch:
            if not _decoded(pipe, [sample]):
                yield sample[0]
                pipe = _decoder(num_threads)


def read_records(root, split, fmt, shard_id, num_shards, random_shuffle, seed):
    """(encoded images, int64 labels) DALI nodes over this shard's records (padded by its
    last one), inside ``with pipe:``; DALI's ``random_shuffle`` follows ``seed`` only."""
    data_path, index_path = records.record_files(root, split, fmt)
    encoded, labels = records.record_format(fmt).read(
        path=[data_path],
        index_path=[index_path],
        shard_id=shard_id,
        num_shards=num_shards,
        random_shuffle=random_shuffle,
        seed=seed,
        pad_last_batch=True,
        stick_to_shard=True,
        name="Reader",
    )
    return encoded, fn.cast(labels, dtype=types.INT64)


def describe_record_error(err, root, split, fmt):
    """A one-line DataError for a RuntimeError of a pipeline reading ``split``'s records."""
    data_path, index_path = records.record_paths(root, split, fmt)
    try:
        records.record_format(fmt).check(index_path, data_path)
    except DataError as malformed:
        return malformed
    return DataError(f"{data_path}: DALI could not read or decode a record ({dali_reason(err)})")


def dali_reason(err):
    """DALI's own reason: the line after "encountered:" (before it: where and what failed)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if "encountered:" in lines[:-1]:
        return lines[lines.index("encountered:") + 1]
    return lines[0] if lines else type(err).__name__
