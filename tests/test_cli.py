"""Bad input reaches the user as one line naming the problem, with exit code 2."""

import os
import shutil
import subprocess
import sys
import tomllib

import pytest

from conftest import FAST_TRAIN, ROOT, once, run_python
from paddle_resnet.commands import train

FAST = list(FAST_TRAIN)


def fails_with(capsys, argv, message):
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip()
    # The error is the last line; Paddle 3.x may print a banner about flags before it.
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and "Traceback" not in err, err
    assert message in last, err
    return last


def copy_tree(root, tmp_path):
    target = tmp_path / "data"
    shutil.copytree(root, target)
    return target


def test_missing_image_root(capsys, tmp_path):
    fails_with(capsys, FAST, "no image root given: set --image-root")
    fails_with(capsys, FAST + ["--image-root", str(tmp_path / "nope")], "nope' does not exist")


def test_empty_class_folder(capsys, fmnist_root, tmp_path):
    data = copy_tree(fmnist_root, tmp_path)
    for image in (data / "train" / "coat").iterdir():
        image.unlink()
    fails_with(
        capsys, FAST + ["--image-root", str(data)], "train/coat: class folder holds no images"
    )


def test_train_and_val_classes_differ(capsys, fmnist_root, tmp_path):
    data = copy_tree(fmnist_root, tmp_path)
    (data / "val" / "coat").rename(data / "val" / "jacket")
    fails_with(capsys, FAST + ["--image-root", str(data)], "train and val class folders differ")


def test_num_of_class_disagrees(capsys, fmnist_root):
    argv = FAST + ["--image-root", fmnist_root, "--num-of-class", "1000"]
    fails_with(capsys, argv, "has 10 class folders but model.num_classes (--num-of-class) is 1000")


@once
def test_corrupt_jpeg_mid_run_keeps_earlier_report(capsys, fmnist_root, tmp_path):
    data = copy_tree(fmnist_root, tmp_path)
    broken = sorted((data / "val" / "bag").iterdir())[3]
    broken.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    report.write_text('{"type": "LOG", "step": [1, 1], "data": {}}\n')
    # The data check at the start of a run refuses it before any training...
    argv = FAST + ["--image-root", str(data), "--output-dir", str(tmp_path / "out")]
    fails_with(capsys, argv, f"{broken.name}: cannot be decoded as an image")
    assert not (tmp_path / "out" / "resnet18").exists()
    # ... without it, the loaders find it when the validation reads it
    fails_with(capsys, argv + ["--no-data-check"], f"{broken.name}: cannot be decoded as an image")
    assert report.read_text().startswith('{"type": "LOG", "step": [1, 1]')
    # The epoch was saved before the validation that failed: no training is lost.
    assert (tmp_path / "out" / "resnet18" / "1" / "meta.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lr", "-1"], "lr.base (--lr) must be positive"),
        (["--batch-size", "0"], "data.batch_size (--batch-size) must be at least 1"),
        (["--set", "optimizer.momentun=0.9"], "unknown config key 'optimizer.momentun'"),
        (["--config", "resnet51_paddle"], "config 'resnet51_paddle' not found; recipes: "),
    ],
)
def test_impossible_values(capsys, fmnist_root, argv, message):
    fails_with(capsys, FAST + ["--image-root", fmnist_root] + argv, message)


def test_unknown_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--learning-rate", "0.1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err


def test_missing_and_truncated_checkpoint(capsys, fmnist_root, tmp_path):
    argv = FAST + ["--image-root", fmnist_root]
    fails_with(capsys, argv + ["--from-checkpoint", str(tmp_path / "none")], "does not exist")
    fake = tmp_path / "resnet18" / "1"
    fake.mkdir(parents=True)
    fails_with(capsys, argv + ["--from-checkpoint", str(fake)], "no meta.json; not a checkpoint")
    (fake / "model.pdparams").write_bytes(b"\x80\x04half a pickle")
    (fake / "meta.json").write_text(
        '{"epoch": 1, "files": {"model.pdparams": {"bytes": 999, "sha256": "00"}}}'
    )
    fails_with(
        capsys,
        argv + ["--from-checkpoint", str(tmp_path / "resnet18")],
        "model.pdparams: truncated or modified",
    )
    fails_with(
        capsys,
        argv + ["--from-pretrained-params", str(fake / "model.pdparams")],
        "model.pdparams: cannot be read",
    )


def test_list_and_show_configs(capsys):
    assert train.main(["--list-configs"]) == 0
    assert "resnet18_demo" in capsys.readouterr().out.split()
    assert train.main(["--config", "resnet18_demo", "--lr", "0.1", "--show-config"]) == 0
    shown = capsys.readouterr().out
    assert "base: 0.1" in shown and "arch: resnet18" in shown


@pytest.mark.gpu_wheel
@once
def test_paddle_distributed_launch_with_one_process(fmnist_root, tmp_path):
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "paddle.distributed.launch",
        "--log_dir",
        str(tmp_path / "log"),
        "train.py",
        *FAST,
        "--image-root",
        fmnist_root,
        "--output-dir",
        str(out),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "resnet18" / "1" / "meta.json").exists()
    assert "val.images 130" in result.stdout + open(tmp_path / "log" / "workerlog.0").read()


def only_line(result):
    lines = [line for line in result.stderr.strip().splitlines() if "FLAGS" not in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@once
def test_a_broken_image_outside_training_is_one_line_not_a_crash(trained, fmnist_root, tmp_path):
    """DALI's CPU decoder crashed the process (SIGSEGV, exit 139) on a failing sample of a
    large batch: evaluation and calibration screen their images before DALI sees them."""
    data = copy_tree(fmnist_root, tmp_path)
    broken = sorted((data / "val" / "bag").iterdir())[3]
    broken.write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    checkpoint = f"{trained.run.output_dir}/resnet18"
    evaluate = [
        "train.py",
        *FAST[:6],
        "--batch-size",
        "130",
        "--run-scope",
        "eval_only",
        "--image-root",
        str(data),
        "--from-checkpoint",
        checkpoint,
    ]
    for _ in range(2):  # today's code crashed in 5 runs of 6 on this batch
        result = run_python(*evaluate)
        assert result.returncode == 2, result.stderr[-2000:]
        assert only_line(result) == f"error: {broken}: cannot be decoded as an image"
    first_class = sorted((data / "train").iterdir())[0]
    calibration = sorted(first_class.iterdir())[0]  # the first image: calibrated on
    calibration.write_bytes(b"")
    export = run_python(
        "export_model.py",
        *FAST[:6],
        "--from-checkpoint",
        checkpoint,
        "--image-root",
        str(data),
        "--inference-dir",
        str(tmp_path / "int8"),
        "--export-log-path",
        str(tmp_path / "export.json"),
        "--ptq-algo",
        "abs_max",
        "--calibration-images",
        "64",
        "--batch-size",
        "64",
    )
    assert export.returncode == 2, export.stderr[-2000:]
    assert only_line(export) == f"error: {calibration}: cannot be decoded as an image"
    assert not (tmp_path / "int8").exists()  # nothing half-written in place
    # training too, and without DALI's own "[ERROR] [jpeg_parser]" line above ours; its
    # data check screens both splits: the broken validation image is counted too
    training = run_python(
        "train.py", *FAST, "--image-root", str(data), "--output-dir", str(tmp_path / "out")
    )
    assert training.returncode == 2
    assert (
        only_line(training) == f"error: {calibration}: cannot be decoded as an image (and 1 more)"
    )


@once
def test_every_tool_has_a_console_script_that_answers_help():
    """The console scripts pyproject.toml declares (the README's commands) are installed
    beside the environment's python, one per tool of paddle_resnet/commands, and each
    answers --help."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        declared = tomllib.load(handle)["project"]["scripts"]
    tools = {
        name[: -len(".py")]
        for name in os.listdir(os.path.join(ROOT, "paddle_resnet", "commands"))
        # the flag table's generator and the Slurm scripts' helper are not users' tools
        if name.endswith(".py") and name not in ("__init__.py", "flag_table.py", "job_progress.py")
    }
    assert tools <= {target.split(":")[0].split(".")[-1] for target in declared.values()}
    for script in ("paddle-resnet-check-sparsity", "paddle-resnet-program", "paddle-resnet-doctor"):
        assert script in declared
        path = os.path.join(os.path.dirname(sys.executable), script)
        result = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and "usage:" in result.stdout, (script, result.stderr[-1000:])


def test_a_script_ends_bad_input_in_one_line(tmp_path):
    """scripts/*.py end a UserError as the tools do (``errors.exit_status``): one line,
    exit status 2, no traceback; here the benchmark's calibration images are missing."""
    missing = tmp_path / "nowhere"
    result = run_python(
        os.path.join("scripts", "benchmark_inference.py"),
        *("--arch", "resnet18", "--size", "32", "--calibration-root", str(missing)),
        *("--output", str(tmp_path / "benchmark.json")),
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert only_line(result) == f"error: image root '{missing}' does not exist or is not a folder"
    assert not (tmp_path / "benchmark.json").exists()
