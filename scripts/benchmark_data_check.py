"""The data check's speed: its fast pass over a tree of ImageNet's size, and its full
decode (``--decode``) over the demo's tree and over ImageNet photos.

    .venv/bin/python scripts/benchmark_data_check.py --tree /tmp/check_tree \\
        --demo-root demo_data/fashion_mnist_demo --output benchmarks/data_check.json

The large tree (written under ``--tree``, removed at the end): 1,000 classes holding
ImageNet's 1,281,167 training and 50,000 validation files, each a distinct JPEG: one of
the 20 ImageNet validation photos foolbox's wheel carries, cut to 128 px, with a JPEG
comment holding its own number (so no two files are the same bytes), about 8 KB, more
than the head and tail the fast pass reads of a file of any size. ``--leaks`` training
files copied into val/ are the duplicates it must find. The fast pass runs on the
files just written (in the page cache), then after their pages are dropped
(``os.sync``, then ``posix_fadvise(DONTNEED)`` on each: their data comes from the disk,
their directory entries and inodes stay cached); beside it, the loaders' screening alone
(the headers and end markers, no counts or hashes).

The decode: ``paddle-resnet-check-data --decode``'s pass (DALI's CPU decoder on every
core) over the demo's 28-px JPEGs, and over ``--photos`` hard links of the 20 512-px
ImageNet photos.
"""

import argparse
import glob
import importlib.util
import io
import json
import os
import platform
import shutil
import sys
import time

from PIL import Image

from paddle_resnet.core.bootstrap import available_cores
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import exit_status
from paddle_resnet.data import check
from paddle_resnet.data.folder import read_headers

IMAGENET_TRAIN, IMAGENET_VAL, CLASSES = 1_281_167, 50_000, 1000


def imagenet_photos():
    """The 20 ImageNet validation JPEGs (512 x 512) of foolbox's wheel, found without
    importing foolbox."""
    package = importlib.util.find_spec("foolbox").submodule_search_locations[0]
    return sorted(glob.glob(os.path.join(package, "data", "imagenet_*.jpg")))


def small_jpegs():
    """The photos cut to 128 px, encoded: the bodies of the tree's files."""
    encoded = []
    for path in imagenet_photos():
        buffer = io.BytesIO()
        Image.open(path).convert("RGB").resize((128, 128)).save(buffer, "JPEG", quality=90)
        encoded.append(buffer.getvalue())
    return encoded


def numbered(jpeg, number):
    """``jpeg`` with a comment segment (FF FE) holding ``number`` after its start marker."""
    text = f"file {number}".encode()
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def write_tree(root, leaks):
    """The ImageNet-sized tree; returns its file count and bytes."""
    bodies = small_jpegs()
    number, written = 0, 0
    for split, total in (("train", IMAGENET_TRAIN), ("val", IMAGENET_VAL)):
        for label in range(CLASSES):
            folder = os.path.join(root, split, f"n{label:08d}")
            os.makedirs(folder)
            for i in range(total // CLASSES + (label < total % CLASSES)):
                data = numbered(bodies[number % len(bodies)], number)
                with open(os.path.join(folder, f"{i:05d}.JPEG"), "wb") as handle:
                    handle.write(data)
                number, written = number + 1, written + len(data)
    for label in range(leaks):  # one training image of each of the first classes
        name = f"n{label:08d}"
        shutil.copy(
            os.path.join(root, "train", name, "00000.JPEG"),
            os.path.join(root, "val", name, "leak.JPEG"),
        )
    return number + leaks, written


def all_files(root):
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names]


def drop_from_page_cache(files):
    os.sync()
    for path in files:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def timed_check(config, decode=False):
    """The tool's pass (without printing): its seconds from the scan on, the CPU seconds
    of its threads, and its Result."""
    start, cpu = time.perf_counter(), time.process_time()
    sources = check.open_sources(config.data)
    result, survey = check.fast_pass(
        sources, config.data.image_root, config.data.format, config.data.crop_size
    )
    if decode:
        result.decode = check.decode_pass(sources, survey, config.data.num_threads)
    return time.perf_counter() - start, time.process_time() - cpu, result


def fast_pass_figures(config, files, uncached):
    """The fast pass, then the screening alone; with ``uncached``, each on files whose
    data has been dropped from the page cache."""
    if uncached:
        drop_from_page_cache(files)
    load = os.getloadavg()[0]  # other processes competing for the cores
    seconds, cpu, result = timed_check(config)
    if uncached:
        drop_from_page_cache(files)
    start, screening_cpu = time.perf_counter(), time.process_time()
    broken = sum(1 for header in read_headers(files) if header.problem)
    screening, screening_cpu = time.perf_counter() - start, time.process_time() - screening_cpu
    found = {f.kind: f.count for f in result.findings}
    print(f"  fast pass {seconds:.1f} s ({cpu:.1f} s CPU), screening alone {screening:.1f} s")
    return {
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "files_per_second": round(result.images / seconds),
        "screening_seconds": round(screening, 1),
        "screening_cpu_seconds": round(screening_cpu, 1),
        "screening_broken": broken,
        "findings": found,
        "load_average_before": round(load, 1),
    }


def decode_figures(image_root):
    config = build_config({"data.image_root": image_root, "check.decode": True})
    _, _, result = timed_check(config, decode=True)
    print(f"  {image_root}: {result.decode}")
    return dict(result.decode, image_root=image_root)


def photo_tree(root, count):
    """``count`` hard links of the 20 ImageNet photos in val/<class>/."""
    photos = imagenet_photos()
    folder = os.path.join(root, "val", "photos")
    os.makedirs(folder)
    for i in range(count):
        os.link(photos[i % len(photos)], os.path.join(folder, f"{i:05d}.jpg"))
    return root


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", required=True, help="a folder to write the large tree in")
    parser.add_argument("--demo-root", required=True, help="the demo's Fashion-MNIST tree")
    parser.add_argument("--leaks", type=int, default=20)
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    if os.path.exists(args.tree):
        raise SystemExit(f"error: {args.tree} exists; give a folder to create")
    figures = {"cores": available_cores(), "python": platform.python_version()}
    try:
        start = time.perf_counter()
        count, size = write_tree(os.path.join(args.tree, "imagenet"), args.leaks)
        figures["tree"] = {
            "files": count,
            "bytes": size,
            "leaks": args.leaks,
            "write_seconds": round(time.perf_counter() - start, 1),
        }
        print(f"wrote {count:,} files, {size / 1e9:.1f} GB")
        config = build_config({"data.image_root": os.path.join(args.tree, "imagenet")})
        files = all_files(config.data.image_root)
        print("page cache warm:")
        figures["fast_pass_cached"] = fast_pass_figures(config, files, uncached=False)
        print("file data dropped from the page cache:")
        figures["fast_pass_uncached"] = fast_pass_figures(config, files, uncached=True)
        shutil.rmtree(os.path.join(args.tree, "imagenet"))
        print("decode:")
        figures["decode_demo"] = decode_figures(args.demo_root)
        figures["decode_imagenet_photos"] = decode_figures(
            photo_tree(os.path.join(args.tree, "photos"), args.photos)
        )
    finally:
        shutil.rmtree(args.tree, ignore_errors=True)
    with open(args.output, "w") as handle:
        json.dump(figures, handle, indent=1)
        handle.write("\n")


if __name__ == "__main__":
    sys.exit(exit_status(main))
