"""Bad input to every reader a user hands files to: empty, truncated, of the wrong kind (a
folder for a file, JSON for YAML), not UTF-8, huge and hostile (a pickle that would run
code, YAML's !!python tags, JSON nested beyond Python's recursion limit). Each ends in
one line naming the file and status 2 (the data check: its findings and status 1), never
a traceback and never status 0.

Most cases call the tools' ``main`` (or the reader the tool calls) in this process: a
traceback there is an exception that fails the test. The pickles that would run code go
through the real commands as subprocesses, where the file they would create is looked for.
"""

import hashlib
import json
import os
import pickle
import socket
import struct
import sys

import numpy as np
import paddle
import pytest
from crafted_pickles import CORPUS

from conftest import FAST_TRAIN, run_command
from paddle_resnet.commands import check_data, export_model, inference, train
from paddle_resnet.core import trackers
from paddle_resnet.core.class_index import read_class_index
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import USER_ERROR, exit_status
from paddle_resnet.data.dali import DataSplit, make_loader, open_split
from paddle_resnet.data.fashion_mnist import CLASSES
from paddle_resnet.data.folder import ImageList
from paddle_resnet.data.screening import screened
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import class_weights, rendezvous
from paddle_resnet.training.weights.files import read_tensors

NOT_UTF8 = "Grüße".encode("latin-1")  # ü and ß as Latin-1: invalid UTF-8
TOO_DEEP = "[" * 100_000  # JSON nested beyond Python's recursion limit


class _CreatesFile:
    """Unpickled, opens a file for writing: what a crafted .pdparams can do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class _RunsShell:
    """Unpickled, runs a shell command creating a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def write(path, content):
    """``content`` (bytes, text, or a function making them: the huge cases are made when
    their test runs) into ``path``."""
    content = content() if callable(content) else content
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def one_line(capsys, call, naming):
    """``call()``'s status is 2 and stderr has one line, naming ``naming``; an exception
    (what ends a tool in a traceback) propagates and fails the test."""
    capsys.readouterr()
    status = call()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == USER_ERROR, err[-3000:]
    assert len(errors) == 1 and naming in errors[0], err[-3000:]
    return errors[0]


def refused(capsys, read, naming):
    """The reader call ``read()`` ended as the tools end (``errors.exit_status``)."""
    return one_line(capsys, lambda: exit_status(read), naming)


def tool_refuses(capsys, main, argv, naming):
    """A tool's ``main(argv)`` in this process."""
    return one_line(capsys, lambda: main([str(arg) for arg in argv]), naming)


# ---------------------------------------------------------------- the recipe (--config)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"run:\n  epochs: 3\n  # " + NOT_UTF8 + b"\n", id="not-utf8"),
        pytest.param(b'model:\n  arch: "resnet1', id="truncated"),
        pytest.param(b'["run", {"epochs": 3}]', id="json-list"),
        pytest.param(b"!!python/object/apply:os.system ['touch {marker}']", id="python-tag"),
        pytest.param(b"a: &a [1, 1]\nb: &b [*a, *a]\nrun:\n  epochs: [*b, *b]\n", id="aliases"),
        # block sequences nested on one line: PyYAML's scanner reaches Python's recursion
        # limit at once ("[" * n is scanned for simple keys first, in seconds)
        pytest.param(b"- " * 100_000, id="too-deep"),
        pytest.param(lambda: b"# " + b"x" * (50 << 20) + b"\nrun:\n  epochs: 3\n", id="50MB"),
    ],
)
def test_a_bad_recipe_is_one_line(tmp_path, capsys, content):
    marker = tmp_path / "created"
    if isinstance(content, bytes):  # the command of the !!python tag creates ``marker``
        content = content.replace(b"{marker}", str(marker).encode())
    path = write(tmp_path / "recipe.yaml", content)
    tool_refuses(capsys, train.main, ["--config", path, "--show-config", "exit"], str(path))
    assert not marker.exists()


def test_a_folder_as_recipe_is_one_line(tmp_path, capsys):
    tool_refuses(capsys, train.main, ["--config", tmp_path, "--show-config", "exit"], str(tmp_path))


@pytest.mark.parametrize("main", [export_model.main, inference.main, check_data.main])
def test_every_tool_refuses_a_recipe_that_is_not_utf8(tmp_path, capsys, main):
    path = write(tmp_path / "recipe.yaml", b"model:\n  arch: resnet18 # " + NOT_UTF8 + b"\n")
    tool_refuses(capsys, main, ["--config", path], f"{path}: not UTF-8 text")


# ---------------------------------------------------------------- class weights


def weights_split():
    return DataSplit("train", tuple(CLASSES), 0)


def csv_of(values):
    return "".join(f"{name},{value}\n" for name, value in zip(CLASSES, values))


@pytest.mark.parametrize(
    "name, content, naming",
    [
        ("weights.csv", b"", "weights.csv"),
        ("weights.csv", csv_of([1.0] * 10).encode()[:-40], "weights.csv"),
        ("weights.csv", b"tshirt_top,1.0\n" + NOT_UTF8 + b",2.0\n", "weights.csv"),
        ("weights.json", b'{"tshirt_top": 1.0, "trou', "weights.json"),
        ("weights.json", json.dumps(list(CLASSES)).encode(), "weights.json"),
        ("weights.json", TOO_DEEP.encode(), "weights.json"),
        ("weights.yaml", b"tshirt_top: 1.0\n", "weights.yaml"),
        ("weights.csv", csv_of(["inf"] + [1.0] * 9).encode(), "tshirt_top"),
        ("weights.csv", csv_of([1.0, "nan"] + [1.0] * 8).encode(), "trouser"),
        ("weights.csv", csv_of([1.0, 1.0, 1e300] + [1.0] * 7).encode(), "pullover"),
        ("weights.json", json.dumps(dict(zip(CLASSES, [1.0] * 9 + [1e39]))).encode(), "ankle_boot"),
        ("weights.csv", lambda: "".join(f"c{i},1.0\n" for i in range(1_000_000)), "weights.csv"),
    ],
    ids=[
        "empty",
        "truncated",
        "not-utf8",
        "truncated-json",
        "json-list",
        "too-deep",
        "yaml",
        "inf",
        "nan",
        "1e300",
        "beyond-float32",
        "million-lines",
    ],
)
def test_a_bad_class_weights_file_is_one_line(tmp_path, capsys, name, content, naming):
    path = write(tmp_path / name, content)
    refused(capsys, lambda: class_weights.resolve(str(path), weights_split()), naming)


def test_a_folder_as_class_weights_is_one_line(tmp_path, capsys):
    refused(capsys, lambda: class_weights.resolve(str(tmp_path), weights_split()), str(tmp_path))


def test_train_refuses_overflowing_class_weights(fmnist_root, tmp_path, capsys):
    path = write(tmp_path / "weights.csv", csv_of([1.0] * 9 + [1e300]))
    argv = [*FAST_TRAIN, "--image-root", fmnist_root, "--output-dir", tmp_path / "out"]
    line = tool_refuses(capsys, train.main, argv + ["--class-weights", path], str(path))
    assert "ankle_boot" in line


# ---------------------------------------------------------------- classes.json, model.json


JSON_CASES = [
    pytest.param(b"", id="empty"),
    pytest.param(b'{"0": "cat", "1": "d', id="truncated"),
    pytest.param(b'{"0": "' + NOT_UTF8 + b'"}', id="not-utf8"),
    pytest.param(b'["cat", "dog"]', id="json-list"),
    pytest.param(TOO_DEEP.encode(), id="too-deep"),
]


@pytest.mark.parametrize("content", JSON_CASES + [pytest.param(b'{"0": 7}', id="not-names")])
def test_a_bad_class_index_is_one_line(tmp_path, capsys, content):
    path = write(tmp_path / "classes.json", content)
    refused(capsys, lambda: read_class_index(str(path)), str(path))


def test_a_folder_as_class_index_is_one_line(tmp_path, capsys):
    folder = tmp_path / "classes.json"
    folder.mkdir()
    refused(capsys, lambda: read_class_index(str(folder)), str(folder))


def export_folder(tmp_path, model_json):
    """An export whose model.json is ``model_json`` (its program is never reached)."""
    folder = tmp_path / "export"
    for name in ("inference.pdmodel", "inference.pdiparams"):
        write(folder / name, b"\0")
    write(folder / "classes.json", json.dumps({"0": "cat", "1": "dog"}))
    write(folder / "model.json", model_json)
    return folder


@pytest.mark.parametrize(
    "content", JSON_CASES + [pytest.param(b'{"arch": "resnet18"}', id="missing-keys")]
)
def test_inference_refuses_a_bad_model_json_in_one_line(tmp_path, capsys, content):
    folder = export_folder(tmp_path, content)
    argv = ["--inference-dir", folder, "--mode", "benchmark", "--use-synthetic"]
    argv += ["--inference-log-path", tmp_path / "log.json"]
    tool_refuses(capsys, inference.main, argv, "model.json")


# ---------------------------------------------------------------- weights files


def paddle_file(path, state):
    path.parent.mkdir(parents=True, exist_ok=True)
    paddle.save(state, str(path))
    return path


def with_nan(name):
    value = np.ones((4, 3), np.float32)
    value[1, 2] = np.nan
    return {"conv1.weight": np.ones((2, 2), np.float32), name: value}


@pytest.mark.parametrize(
    "case",
    ["creates-file", "runs-shell", "nan", "inf", "list", "truncated", "json"],
)
def test_a_bad_pretrained_file_is_one_line(tmp_path, capsys, case):
    marker = tmp_path / "created"
    path = tmp_path / "weights.pdparams"
    if case == "creates-file":
        write(path, pickle.dumps({"conv1.weight": _CreatesFile(marker)}))
    elif case == "runs-shell":
        write(path, pickle.dumps({"conv1.weight": _RunsShell(marker)}, protocol=2))
    elif case == "nan":
        paddle_file(path, with_nan("fc.weight"))
    elif case == "inf":
        paddle_file(path, {"fc.bias": np.array([1.0, np.inf], np.float32)})
    elif case == "list":
        write(path, pickle.dumps([np.ones(3, np.float32)]))
    elif case == "truncated":
        whole = pickle.dumps({"fc.weight": np.ones((64, 64), np.float32)}, protocol=4)
        write(path, whole[: len(whole) // 2])
    else:
        write(path, json.dumps({"fc.weight": [1.0, 2.0]}))
    line = refused(capsys, lambda: read_tensors(str(path)), str(path))
    assert not marker.exists()
    if case in ("nan", "inf"):
        assert ("fc.weight" if case == "nan" else "fc.bias") in line


def test_a_bad_safetensors_file_is_one_line(tmp_path, capsys):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "weights.safetensors"
    safetensors_numpy.save_file(with_nan("layer1.0.conv1.weight"), str(path))
    line = refused(capsys, lambda: read_tensors(str(path)), str(path))
    assert "layer1.0.conv1.weight" in line


def checkpoint_folder(folder, files, meta=None):
    """A checkpoint folder holding ``files`` ({name: bytes}) whose meta.json records their
    sizes and SHA-256 (as ``save_checkpoint`` does), or holding ``meta`` as meta.json."""
    folder.mkdir(parents=True)
    for name, content in files.items():
        write(folder / name, content)
    if meta is None:
        meta = json.dumps(
            {
                "epoch": 1,
                "classes": list(CLASSES),
                "config": {},
                "files": {
                    name: {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
                    for name, content in files.items()
                },
            }
        ).encode()
    write(folder / ckpt.META, meta)
    return folder


def pickled(state):
    return pickle.dumps(state, protocol=4)


@pytest.mark.parametrize(
    "files, meta, naming",
    [
        ({}, b"", "meta.json"),
        ({}, b'{"epoch": 1, "fi', "meta.json"),
        ({}, b'{"epoch": "' + NOT_UTF8 + b'"}', "meta.json"),
        ({}, b"[1, 2]", "meta.json"),
        ({}, b'{"files": ["model.pdparams"]}', "meta.json"),
        ({}, TOO_DEEP.encode(), "meta.json"),
        ({}, b'{"epoch": 1, "config": {}, "files": {}}', "no 'classes'"),
        ({"model.pdparams": pickled({"w": np.ones(3, np.float32)})[:-9]}, None, "model.pdparams"),
        ({"model.pdparams": pickled({"w": np.array([np.nan], np.float32)})}, None, "'w'"),
        (
            {
                "model.pdparams": pickled({"w": np.ones(3, np.float32)}),
                "model.pdopt": pickled({"w_velocity_0": np.array([0.0, -np.inf], np.float32)}),
            },
            None,
            "w_velocity_0",
        ),
        (
            {
                "model.pdparams": pickled({"w": np.ones(3, np.float32)}),
                "model.pdopt": pickled({"w_velocity_0": _CreatesFile("{marker}")}),
            },
            None,
            "model.pdopt",
        ),
    ],
    ids=[
        "empty-meta",
        "truncated-meta",
        "not-utf8-meta",
        "list-meta",
        "files-list-meta",
        "too-deep-meta",
        "meta-without-classes",
        "truncated-params",
        "nan-params",
        "inf-momentum",
        "hostile-pdopt",
    ],
)
def test_a_bad_checkpoint_is_one_line(tmp_path, capsys, files, meta, naming):
    marker = tmp_path / "created"
    files = {
        name: content.replace(b"{marker}", str(marker).encode()) for name, content in files.items()
    }
    folder = checkpoint_folder(tmp_path / "1", files, meta)
    refused(capsys, lambda: ckpt.read_checkpoint(str(folder)), naming)
    assert not marker.exists()


def test_a_damaged_meta_json_beside_pretrained_weights_is_one_line(tmp_path, capsys):
    """A checkpoint's model.pdparams given to --from-pretrained-params: its meta.json
    names the classes and the architecture it was trained as."""
    folder = checkpoint_folder(tmp_path / "1", {}, b'{"classes": ["cat"], "files": []}')
    refused(capsys, lambda: ckpt.classes_beside(str(folder / "model.pdparams")), "meta.json")


def test_a_folder_as_meta_json_is_one_line(tmp_path, capsys):
    folder = tmp_path / "1"
    (folder / ckpt.META).mkdir(parents=True)
    refused(capsys, lambda: ckpt.read_checkpoint(str(folder)), ckpt.META)


# ---------------------------------------------------------------- through the commands


def refused_by(result, naming):
    """A subprocess's one line: status 2, no traceback."""
    assert result.returncode == USER_ERROR, (result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and naming in errors[0], result.stderr[-3000:]
    return errors[0]


def test_train_refuses_a_pretrained_pickle_that_segfaulted_every_rank(fmnist_root, tmp_path):
    """The forged dtype of an object field read as raw bytes (tests/crafted_pickles.py):
    SIGSEGV before, one line now."""
    path = write(tmp_path / "crafted.pdparams", CORPUS["forged-dtype/object-field"])
    result = run_command(
        [
            sys.executable,
            "train.py",
            *FAST_TRAIN,
            *("--image-root", fmnist_root, "--output-dir", str(tmp_path / "out")),
            *("--from-pretrained-params", str(path)),
        ]
    )
    line = refused_by(result, str(path))
    assert "refused: its pickle asks for builtins.str" in line


def test_train_refuses_a_checkpoint_pickle_that_would_run_a_command(fmnist_root, tmp_path):
    marker = tmp_path / "created"
    folder = checkpoint_folder(
        tmp_path / "resnet18" / "1",
        {"model.pdparams": pickle.dumps({"conv1.weight": _RunsShell(marker)})},
    )
    result = run_command(
        [
            sys.executable,
            "train.py",
            *FAST_TRAIN,
            *("--image-root", fmnist_root, "--output-dir", str(tmp_path / "out")),
            *("--from-checkpoint", str(folder)),
        ]
    )
    line = refused_by(result, os.path.join(str(folder), "model.pdparams"))
    assert "system" in line
    assert not marker.exists()


# ---------------------------------------------------------------- images and record files


def image_tree(root, fmnist_root):
    """A tree of two classes, a and b, one real image in each of each split; the
    image's bytes."""
    good = os.path.join(fmnist_root, "train", CLASSES[0])
    image = open(os.path.join(good, sorted(os.listdir(good))[0]), "rb").read()
    for split in ("train", "val"):
        for name in ("a", "b"):
            write(root / split / name / "good.jpg", image)
    return image


NOT_UTF8_NAME = os.fsdecode(b"\xff\xfe.jpg")  # os.listdir's str of a name that is not UTF-8


def broken_tree(root, fmnist_root):
    """``image_tree`` with, in train/a, every kind of file that is no image and an
    image whose name is not UTF-8."""
    image = image_tree(root, fmnist_root)
    bad = root / "train" / "a"
    write(bad / "empty.jpg", b"")
    write(bad / "truncated.jpg", image[: len(image) // 3])
    write(bad / "text.jpg", "not an image\n")
    (bad / "folder.jpg").mkdir()
    (bad / "dangling.jpg").symlink_to(bad / "nowhere.jpg")
    write(bad / NOT_UTF8_NAME, image)
    # a PNG whose header claims 100,000 x 100,000 pixels: Pillow's decompression bomb
    header = b"\x00\x01\x86\xa0" * 2 + b"\x08\x02\x00\x00\x00"
    write(
        bad / "bomb.png",
        b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + header + b"\0\0\0\0",
    )
    return root


def test_the_data_check_names_broken_images_without_a_traceback(fmnist_root, tmp_path, capsys):
    root = broken_tree(tmp_path / "tree", fmnist_root)
    status = check_data.main(["--image-root", str(root), "--crop-size", "16"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "2 files that cannot be read" in out and "train/a/folder.jpg" in out, out
    assert "4 files that Pillow cannot identify as an image" in out, out
    assert "train/a/\\udcff\\udcfe.jpg" in out, out  # the name that is not UTF-8, escaped


def test_train_refuses_a_tree_with_broken_images_in_one_line(fmnist_root, tmp_path, capsys):
    root = broken_tree(tmp_path / "tree", fmnist_root)
    argv = [*FAST_TRAIN[:2], "--num-of-class", 2, "--crop-size", 16, "--resize-short", 16]
    argv += ["--image-root", root, "--output-dir", tmp_path / "out"]
    tool_refuses(capsys, train.main, argv, str(root))


def test_an_image_name_that_is_not_utf8_is_one_line(fmnist_root, tmp_path, capsys):
    """A decodable image whose name is not UTF-8: DALI's reader cannot take the name."""
    root = tmp_path / "tree"
    write(root / "train" / "a" / NOT_UTF8_NAME, image_tree(root, fmnist_root))
    config = build_config(
        {"data.image_root": str(root), "data.batch_size": 2, "data.crop_size": 16}
    )
    refused(
        capsys,
        lambda: make_loader(open_split(config.data, "train"), config.data, "NCHW", False),
        r"/\udcff\udcfe.jpg': its name is not UTF-8",
    )


@pytest.mark.parametrize(
    "fmt, files, naming",
    [
        ("recordio", {"val.rec": b"", "val.idx": b""}, "val"),
        ("recordio", {"val.rec": b"\0" * 64, "val.idx": b"0\t0\n"}, "val.rec"),
        ("recordio", {"val.rec": b"\0" * 64, "val.idx": b"x\ty\n"}, "val.idx"),
        ("recordio", {"val.rec": b"\0" * 64, "val.idx": b"0\t" + NOT_UTF8 + b"\n"}, "val.idx"),
        ("tfrecord", {"val.tfrecord": b"\0" * 10, "val.tfrecord.idx": b"0 10\n"}, "val.tfrecord"),
        ("tfrecord", {"val.tfrecord": b"", "val.tfrecord.idx": b"0 16\n"}, "no images"),
    ],
    ids=[
        "empty",
        "no-record",
        "index-not-numbers",
        "index-not-utf8",
        "tfrecord-cut",
        "tfrecord-empty",
    ],
)
def test_bad_record_files_are_one_line(tmp_path, capsys, fmt, files, naming):
    root = tmp_path / "records"
    for name, content in files.items():
        write(root / name, content)
    write(root / "classes.json", json.dumps({"0": "cat", "1": "dog"}))
    status = check_data.main(["--image-root", str(root), "--data-format", fmt])
    captured = capsys.readouterr()
    assert status in (1, USER_ERROR), captured.out + captured.err
    assert naming in captured.out + captured.err


def test_records_with_a_bad_class_index_are_one_line(tmp_path, capsys):
    root = tmp_path / "records"
    write(root / "val.rec", b"")
    write(root / "val.idx", b"")
    write(root / "classes.json", b'["cat", "dog"]')
    argv = ["--image-root", root, "--data-format", "recordio"]
    tool_refuses(capsys, check_data.main, argv, "classes.json")


# ---------------------------------------------------------------- flags added since
# trackers, sampling, logit adjustment, timed saves: refused as the config is built, before
# the run writes anything ("FILE": a file, "DIR": a folder, made by the test)

LATER_FLAGS = [
    (["--tracker", "nonsense"], "(--tracker) must be one of tensorboard, mlflow, visualdl"),
    (["--tracker", "tensorboard", "--tensorboard-log-dir", "FILE"], "(--tensorboard-log-dir)"),
    (
        ["--tracker", "tensorboard", "--tensorboard-log-dir", "FILE/runs"],
        "FILE is not one (on its way)",
    ),
    (["--visualdl-log-dir", "FILE"], "(--visualdl-log-dir) must name a folder, but FILE"),
    (["--tracker", "mlflow", "--mlflow-tracking-uri", "sqlite:///DIR"], "(--mlflow-tracking-uri)"),
    (["--mlflow-tracking-uri", "sqlite:///FILE/mlflow.db"], "(--mlflow-tracking-uri)"),
    (["--sampling", "nonsense"], "(--sampling) must be one of shuffle, class-balanced"),
    (["--sampling", "class-balanced", "--logit-adjustment", "1"], "--sampling class-balanced"),
    (["--sampling", "class-balanced", "--class-weights", "balanced"], "--sampling class-balanced"),
    (["--logit-adjustment", "-1"], "(--logit-adjustment) must be at least 0"),
    (["--logit-adjustment", "nan"], "(--logit-adjustment) must be a finite number, got nan"),
    (["--logit-adjustment", "inf"], "(--logit-adjustment) must be a finite number, got inf"),
    (["--logit-adjustment", "strong"], "--logit-adjustment: loss.logit_adjustment='strong'"),
    (["--class-weights-from-epoch", "0", "--class-weights", "balanced"], "-from-epoch) must be"),
    (["--class-weights-from-epoch", "1.5"], "--class-weights-from-epoch: "),
    (["--class-weights-from-epoch", "3"], "--class-weights-from-epoch needs --class-weights"),
    (["--save-every-minutes", "-5"], "(--save-every-minutes) must be at least 0"),
    (["--save-every-minutes", "inf"], "(--save-every-minutes) must be a finite number, got inf"),
    (["--save-every-minutes", "soon"], "--save-every-minutes: run.save_every_minutes='soon'"),
    (["--set", "run.save_every_minutes=.nan"], "(--save-every-minutes) must be a finite number"),
]


@pytest.mark.parametrize(
    "flags, naming", LATER_FLAGS, ids=["_".join(flags).strip("-") for flags, _ in LATER_FLAGS]
)
def test_a_bad_value_of_a_later_flag_is_one_line(tmp_path, capsys, flags, naming):
    places = {"FILE": str(write(tmp_path / "file", "x")), "DIR": str(tmp_path)}
    for name, path in places.items():
        flags = [flag.replace(name, path) for flag in flags]
        naming = naming.replace(name, path)
    out = tmp_path / "out"  # --show-config exit: a value let through ends here, status 0
    tool_refuses(capsys, train.main, [*flags, "--output-dir", out, "--show-config", "exit"], naming)
    assert not out.exists()


def tree_split(counts):
    """A training split of an image tree, ``counts[i]`` images of class ``c<i>``."""
    labels = tuple(label for label, count in enumerate(counts) for _ in range(count))
    classes = tuple(f"c{label}" for label in range(len(counts)))
    files = tuple(f"/tree/train/c{label}/{n}.jpg" for n, label in enumerate(labels))
    return DataSplit("train", classes, len(files), ImageList(files, labels, classes))


@pytest.mark.parametrize(
    "values, split, naming",
    [
        ({"data.sampling": "class-balanced"}, weights_split(), "--sampling class-balanced"),
        ({"loss.logit_adjustment": 1.0}, weights_split(), "--logit-adjustment counts"),
        ({"loss.logit_adjustment": 1.0}, tree_split([3, 0]), "class 'c1', whose prior"),
        ({"loss.logit_adjustment": 1e39}, tree_split([1, 1]), "'c0''s offset, -6.93e+38"),
    ],
    ids=["balanced-records", "adjusted-records", "empty-class", "beyond-float32"],
)
def test_the_split_refuses_sampling_and_logit_adjustment_in_one_line(capsys, values, split, naming):
    """What the training split decides: class counts of record files, a prior of 0, offsets
    that would be -inf in the float32 loss."""
    refused(capsys, lambda: class_weights.for_run(build_config(values), split), naming)


def test_a_damaged_mlflow_database_is_one_line(tmp_path, capsys):
    """A SQLite file that is no database (SQLAlchemy's DatabaseError was a traceback)."""
    pytest.importorskip("mlflow")
    path = write(tmp_path / "mlflow.db", bytes(range(256)) * 16)
    uri = f"sqlite:///{path}"
    args = (("mlflow",), str(tmp_path / "out"), None, uri, None, None, True)
    line = refused(capsys, lambda: trackers.opened(*args), f"--tracker mlflow at {uri}")
    assert "file is not a database" in line


# ---------------------------------------------------------------- the job's store


class Store(dict):
    """A job's key-value store holding what a test planted: as Paddle's, ``get`` of a
    value gives what was set, ``add`` counts."""

    def add(self, key, amount):
        self[key] = dict.get(self, key, 0) + amount
        return self[key]

    def set(self, key, value):
        self[key] = value

    def get(self, key):
        return self[key]


def rank_1_of_2(planted):
    """Rank 1's agreements over a store holding ``planted`` ({key below PREFIX: value})."""
    store = Store({f"{rendezvous.PREFIX}/{key}": value for key, value in planted.items()})
    return rendezvous.Rendezvous(store, rank=1, world_size=2, sleep=lambda pause: None)


def shares_screening(meeting):
    split = tree_split([1, 1])
    screened(build_config({}), split, None, meeting.rank, meeting.share)


def shares_auto(meeting):
    meeting.share("from-checkpoint auto", check=rendezvous.checkpoint_name_problem)


def waits(meeting):
    """Rank 1 waits for rank 0, which ended the start: its end is read."""
    meeting.agree("programs")


def screening(broken):
    return json.dumps({"broken": broken, "lines": [], "record": None, "cached": False})


ENDED = {"ended": 1, "ended/0": 1}
STORE_CASES = {
    "auto-not-utf8": (shares_auto, {"shared/from-checkpoint auto": b'"\xff"'}, "not JSON"),
    "auto-truncated": (shares_auto, {"shared/from-checkpoint auto": b'"17'}, "not JSON"),
    "auto-too-deep": (shares_auto, {"shared/from-checkpoint auto": TOO_DEEP}, "not JSON"),
    "auto-outside": (shares_auto, {"shared/from-checkpoint auto": '"../1"'}, "name a file"),
    "screening-list": (shares_screening, {"shared/screening": "[]"}, "not a screening"),
    "screening-past-end": (
        shares_screening,
        {"shared/screening": screening({"train": [2]})},
        "2 images",
    ),
    "screening-negative": (
        shares_screening,
        {"shared/screening": screening({"train": [-1]})},
        "2 images",
    ),
    "screening-text": (
        shares_screening,
        {"shared/screening": screening({"train": ["0"]})},
        "2 images",
    ),
    "screening-no-split": (
        shares_screening,
        {"shared/screening": screening({})},
        "by split (train)",
    ),
    "end-not-json": (waits, {**ENDED, "why/0": b"status 2"}, "not JSON"),
    "end-list": (waits, {**ENDED, "why/0": "[2]"}, "not a rank's end"),
    "end-status-text": (
        waits,
        {**ENDED, "why/0": '{"status": "2", "line": "x"}'},
        "not a rank's end",
    ),
}


@pytest.mark.parametrize("wait, planted, naming", STORE_CASES.values(), ids=STORE_CASES)
def test_a_bad_value_in_the_jobs_store_is_one_line(capsys, wait, planted, naming):
    """What rank 1 reads from the job's store, as rank 0 or a peer that ended would have
    written it, refused in one line naming its key (json.loads raised; a screening's
    positions picked the files the loaders skip: past the end an IndexError, -1 the last
    image)."""
    planted = {**planted, **{f"{key}/ready": 1 for key in planted}}
    key = next(key for key in planted if key.startswith(("shared/", "why/")))
    line = refused(capsys, lambda: wait(rank_1_of_2(planted)), f"'{rendezvous.PREFIX}/{key}'")
    assert naming in line


@pytest.mark.parametrize(
    "place", [b"", b"\xff\xfe", b"host", "{host} -1", "{host} 1/../..", "{host} 7 8", "{host} ٣"]
)
def test_a_peers_place_in_the_store_that_is_no_place_is_no_process_here(place):
    """The roll call after a failed collective reads where rank 0 runs ("<host> <pid>",
    its id names /proc/<id>/stat): anything else is no place on this host (it raised
    ValueError in the roll call); rank 0, silent, is named."""
    if isinstance(place, str):
        place = place.replace("{host}", socket.gethostname()).encode()
    meeting = rank_1_of_2({"where/0": place, "where/0/ready": 1})
    assert meeting.roll_call(seconds=0.0) == [0]
