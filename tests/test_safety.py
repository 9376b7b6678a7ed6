"""Nothing silently wrong: runs never mix, labels never shift, ASP state is kept, outputs
that cannot be written are named before work is lost, and Paddle's chatter stays hidden."""

import fcntl
import io
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import time

import paddle
import pytest

from conftest import FAST_TRAIN, ROOT, flat, once, small_config
from paddle_resnet.commands import inference, train
from paddle_resnet.core import devices, paddle_internals, provenance
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import CheckpointError, ConfigError, DataError
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import epochs, ir, run_folder
from paddle_resnet.training import run as training_run


def quiet():
    return open(os.devnull, "w")


def test_a_fresh_run_refuses_a_folder_holding_another_runs_checkpoints(trained):
    again = build_config(dict(flat(trained), **{"run.report_file": None}))
    with pytest.raises(
        CheckpointError,
        match=r"resnet18 already holds checkpoints of an "
        r"earlier run \(epochs 1-3\): continue it with --from-checkpoint auto",
    ):
        train.run(again, report_stream=quiet())


def test_resume_refuses_a_checkpoint_of_another_run(trained, fmnist_root, tmp_path):
    other = small_config(
        fmnist_root,
        tmp_path,
        **{
            "lr.base": 0.4,
            "run.epochs": 4,
            "model.zero_init_residual": True,
            "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
        },
    )
    with pytest.raises(CheckpointError) as error:
        train.run(other, report_stream=quiet())
    message = str(error.value)
    assert "belongs to another run" in message and "run.epochs" not in message  # may extend
    assert "lr.base: 0.8 -> 0.4" in message and "model.zero_init_residual: False -> True" in message


@once
def test_resuming_an_asp_checkpoint_without_asp_is_refused(trained, fmnist_root, tmp_path):
    sparse_out = tmp_path / "sparse"
    params = os.path.join(
        run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
    )
    sparse = small_config(
        fmnist_root,
        sparse_out,
        **{
            "asp.enabled": True,
            "asp.prune_model": True,
            "run.epochs": 1,
            "run.from_pretrained_params": params,
            "run.run_scope": "train_only",
        },
    )
    train.run(sparse, report_stream=quiet())
    dense_resume = small_config(
        fmnist_root,
        sparse_out,
        **{"run.epochs": 2, "run.from_checkpoint": str(sparse_out / "resnet18" / "1")},
    )
    with pytest.raises(CheckpointError, match=r"asp.enabled: True -> False"):
        train.run(dense_resume, report_stream=quiet())


def test_asp_without_prune_model_on_dense_weights_is_refused(trained, fmnist_root, tmp_path):
    params = os.path.join(
        run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3), "model.pdparams"
    )
    config = small_config(
        fmnist_root,
        tmp_path,
        **{"asp.enabled": True, "run.epochs": 1, "run.from_pretrained_params": params},
    )
    with pytest.raises(ConfigError, match="these weights are dense: add --prune-model"):
        train.run(config, report_stream=quiet())


def renamed_tree(fmnist_root, tmp_path):
    """The fixture tree with one class folder renamed: same count, other names."""
    data = tmp_path / "renamed"
    shutil.copytree(fmnist_root, data)
    for split in ("train", "val"):
        os.rename(data / split / "bag", data / split / "purse")
    return str(data)


def test_evaluation_refuses_data_whose_class_names_are_not_the_models(
    trained, fmnist_root, tmp_path
):
    data = renamed_tree(fmnist_root, tmp_path)
    config = small_config(
        data,
        tmp_path / "out",
        **{
            "run.run_scope": "eval_only",
            "run.from_checkpoint": os.path.join(trained.run.output_dir, "resnet18"),
        },
    )
    with pytest.raises(DataError, match="class names .* are not the model's"):
        train.run(config, report_stream=quiet())


def test_inference_accuracy_refuses_renamed_classes(trained, fmnist_root, tmp_path, capsys):
    model_dir = tmp_path / "model"
    assert (
        subprocess.run(
            [
                sys.executable,
                "export_model.py",
                "--model-arch-name",
                "resnet18",
                "--num-of-class",
                "10",
                "--crop-size",
                "32",
                "--resize-short",
                "32",
                "--from-checkpoint",
                os.path.join(trained.run.output_dir, "resnet18"),
                "--inference-dir",
                str(model_dir),
                "--export-log-path",
                str(tmp_path / "export.json"),
            ],
            cwd=ROOT,
        ).returncode
        == 0
    )
    data = renamed_tree(fmnist_root, tmp_path)
    assert (
        inference.main(
            [
                "--inference-dir",
                str(model_dir),
                "--mode",
                "accuracy",
                "--image-root",
                data,
                "--inference-log-path",
                str(tmp_path / "log.json"),
            ]
        )
        == 2
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "are not the model's" in last and "'purse'" in last and "'bag'" in last


def test_auto_refuses_a_folder_of_another_run_and_evaluates_the_newest(trained, tmp_path, capsys):
    """--from-checkpoint auto keeps the same-run check (one line naming the difference),
    and eval_only with auto evaluates the folder's newest checkpoint."""
    other = build_config(
        dict(flat(trained), **{"lr.base": 0.4, "run.from_checkpoint": "auto", "run.epochs": 4})
    )
    with pytest.raises(CheckpointError, match=r"resnet18/3 belongs to another run: lr.base"):
        train.run(other, report_stream=quiet())
    values = {"run.run_scope": "eval_only", "run.from_checkpoint": "auto"}
    values["run.report_file"] = str(tmp_path / "report.json")  # not the shared run's report
    train.run(build_config(dict(flat(trained), **values)))
    out = capsys.readouterr().out
    newest = run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3)
    assert f"--from-checkpoint auto: {newest}, the newest checkpoint of this run" in out
    assert f"evaluating checkpoint {newest} (epoch 3)" in out


@once  # the run folder's policy (training/run_folder.py) is plain Python over files
def test_auto_skips_a_damaged_newest_checkpoint_with_a_warning(trained, tmp_path):
    """A checkpoint damaged after it was written (the writes are atomic: storage, a
    person) is skipped, named in a warning, and the run continues from the one before."""
    folder = tmp_path / "resnet18"
    shutil.copytree(os.path.join(trained.run.output_dir, "resnet18"), folder)
    with open(folder / "3" / "model.pdparams", "r+b") as handle:
        handle.truncate(100)
    lines = []
    assert run_folder.Checkpoints(str(folder)).newest_verified(lines.append) == str(folder / "2")
    assert len(lines) == 1 and lines[0].startswith(f"warning: {folder}/3/model.pdparams: trunc")
    assert run_folder.Checkpoints(str(tmp_path / "empty")).newest_verified(lines.append) is None


def copy_of_trained(trained, tmp_path, damaged=(), **values):
    """A copy of the ``trained`` run's checkpoints (epochs 1-3) in a folder of its own,
    the model files of epochs ``damaged`` truncated; its config with ``values``."""
    out = tmp_path / "out"
    shutil.copytree(os.path.join(trained.run.output_dir, "resnet18"), out / "resnet18")
    for epoch in damaged:
        with open(out / "resnet18" / str(epoch) / "model.pdparams", "r+b") as handle:
            handle.truncate(100)
    values = {"run.output_dir": str(out), "run.report_file": None, **values}
    return out / "resnet18", build_config(dict(flat(trained), **values))


REWOUND = r"\.rewound-\d{8}T\d{6}Z"


@once  # the run folder's policy (training/run_folder.py) is plain Python over files
def test_a_rewind_moves_the_newer_checkpoints_aside_and_auto_follows_the_new_branch(
    trained, tmp_path
):
    """--from-checkpoint of epoch 1 while 2 and 3 exist: they move aside in one line (a
    later auto would have continued the abandoned branch), retention keeps the checkpoint
    the run resumed from, and a checkpoint of other code says so, naming both."""
    start = tmp_path / "out" / "resnet18" / "1"
    folder, config = copy_of_trained(
        trained,
        tmp_path,
        **{"run.from_checkpoint": str(start), "run.epochs": 2, "run.keep_checkpoints": 1},
    )
    meta_path = folder / "1" / ckpt.META
    meta = json.loads(meta_path.read_text())
    assert set(meta["code"]) >= {"toolkit", "paddle", "ir"}
    meta["code"].update(toolkit="0.1.0", commit="0123456789abcdef", paddle="2.5.2")
    meta_path.write_text(json.dumps(meta))  # meta.json is not among the checksummed files
    console = io.StringIO()
    train.run(config, report_stream=console)
    lines = console.getvalue().splitlines()
    rewound = [line for line in lines if line.startswith("rewound to ")]
    assert len(rewound) == 1 and re.fullmatch(
        rf"rewound to {folder}/1: the newer checkpoints 2, 3 moved aside as 2{REWOUND}, "
        rf"3{REWOUND} \(--from-checkpoint auto and --keep-checkpoints leave them alone; "
        r"removed after 30 days\)",
        rewound[0],
    ), rewound
    now = provenance.code()
    commit = f" (commit {now['commit'][:10]})" if now.get("commit") else ""
    assert (
        "warning: the checkpoint was written by paddle-resnet 0.1.0 (commit 0123456789) on "
        f"Paddle 2.5.2, this run is paddle-resnet {now['toolkit']}{commit} on Paddle "
        f"{now['paddle']}: it continues, on other code"
    ) in console.getvalue()
    names = sorted(os.listdir(folder))
    assert names[:2] == ["1", "2"] and len(names) == 4, names  # 1: resumed from, kept
    assert run_folder.Checkpoints(str(folder)).newest_verified(print) == str(folder / "2")
    assert ckpt.read_checkpoint(str(folder / "2"))[0]["code"] == dict(now, ir=ir.chosen(config)[0])


@once  # the run folder's policy (training/run_folder.py) is plain Python over files
def test_damaged_newer_checkpoints_never_cost_a_good_one(trained, tmp_path):
    """The case found by hand: epochs 2 and 3 damaged, --from-checkpoint auto
    --keep-checkpoints 1 resumed from 1, and after saving 2 removed 1 and 2, leaving the
    damaged 3 alone; a kill then left nothing to continue from. Now the damaged ones move
    aside, and neither the new checkpoint nor the one resumed from is removed."""
    folder, config = copy_of_trained(
        trained,
        tmp_path,
        damaged=(2, 3),
        **{"run.from_checkpoint": "auto", "run.epochs": 2, "run.keep_checkpoints": 1},
    )
    console = io.StringIO()
    train.run(config, report_stream=console)
    out = console.getvalue()
    assert f"--from-checkpoint auto: {folder}/1, the newest checkpoint of this run" in out
    assert "removed older checkpoints" not in out
    assert sorted(os.listdir(folder))[:2] == ["1", "2"]
    for epoch in (1, 2):
        ckpt.verify_checkpoint(str(folder / str(epoch)))
    # retention itself: a damaged checkpoint among the newest N is not counted as one
    shutil.copytree(folder / "2", folder / "3")
    with open(folder / "2" / "model.pdparams", "r+b") as handle:
        handle.truncate(100)
    assert (
        run_folder.Checkpoints(str(folder)).remove_superseded(str(folder / "3"), 2, (0, 0)) == []
    )  # 1 is the second
    assert run_folder.Checkpoints(str(folder)).remove_superseded(str(folder / "3"), 1, (0, 0)) == [
        "2",
        "1",
    ]  # 3 alone


def test_copies_a_rewind_set_aside_go_after_their_days(tmp_path):
    """A rewind's set-aside copies are kept run_folder.SET_ASIDE_DAYS days, then pruned at
    the next rewind or retention (by the time in their name)."""
    folder = tmp_path / "resnet18"
    recent = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for name in ("4", "5.rewound-20200101T000000Z", f"6.rewound-{recent}", "7.rewound-x"):
        (folder / name).mkdir(parents=True)
    assert run_folder.Checkpoints(str(folder)).prune_set_aside() == ["5.rewound-20200101T000000Z"]
    assert sorted(os.listdir(folder)) == ["4", f"6.rewound-{recent}", "7.rewound-x"]


def test_auto_says_so_when_every_checkpoint_is_damaged(trained, tmp_path):
    folder, config = copy_of_trained(
        trained, tmp_path, damaged=(1, 2, 3), **{"run.from_checkpoint": "auto"}
    )
    with pytest.raises(CheckpointError) as error:
        train.run(config, report_stream=quiet())
    message = str(error.value)
    assert message.startswith(
        f"--from-checkpoint auto: every checkpoint in {folder} is damaged (epochs 1-3; the "
        f"newest: {folder}/3/model.pdparams: truncated or modified (expected "
    ), message
    assert message.endswith(
        f"): restore one from a copy, or move the folder aside (mv {folder} {folder}.damaged) "
        "to start afresh"
    ), message


def test_export_refuses_auto_in_one_line(trained, tmp_path):
    result = subprocess.run(
        [sys.executable, "export_model.py", "--from-checkpoint", "auto"]
        + ["--model-arch-name", "resnet18", "--num-of-class", "10"]
        + ["--inference-dir", str(tmp_path / "model")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --from-checkpoint auto continues a training run in its --output-dir; "
        "name a checkpoint folder here"
    )


def test_a_newest_checkpoint_folder_without_meta_is_named(trained, tmp_path):
    folder = tmp_path / "resnet18"
    shutil.copytree(os.path.join(trained.run.output_dir, "resnet18"), folder)
    os.remove(folder / "3" / "meta.json")
    with pytest.raises(
        CheckpointError,
        match=r"resnet18/3: the newest checkpoint folder has "
        r"no meta.json",
    ):
        ckpt.read_checkpoint(str(folder))


@pytest.mark.parametrize(
    "where, cause",
    [
        ("/proc/self/cannot_write", "cannot write there"),
        ("FILE", "is a file, not a folder"),
    ],
)
def test_unwritable_output_folders_are_named_before_training(
    fmnist_root, tmp_path, capsys, where, cause
):
    if where == "FILE":
        where = str(tmp_path / "a_file")
        open(where, "w").close()
    assert (
        train.main(
            [
                *FAST_TRAIN,
                "--image-root",
                fmnist_root,
                "--output-dir",
                where,
            ]
        )
        == 2
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: --output-dir {where}: {cause}"), last


def test_a_full_disk_while_saving_is_one_line_and_keeps_earlier_checkpoints(
    trained, tmp_path, monkeypatch
):
    folder = tmp_path / "resnet18"
    shutil.copytree(os.path.join(trained.run.output_dir, "resnet18"), folder)

    def disk_full(program, prefix):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paddle.static, "save", disk_full)
    with pytest.raises(
        CheckpointError,
        match=r"resnet18/4: the checkpoint cannot be written \(No space left on device: "
        r"free space or raise the quota \(--keep-checkpoints N keeps fewer\)\); the earlier",
    ):
        ckpt.save_checkpoint(paddle.static.Program(), str(folder / "4"), {"epoch": 4})
    assert [progress for progress, _ in ckpt.saved_checkpoints(str(folder))] == [
        (1, 0),
        (2, 0),
        (3, 0),
    ]
    assert sorted(os.listdir(folder)) == ["1", "2", "3"]  # no staging left behind


CHATTER = (
    "valid_optimizer_list",
    "meta_optimizer=",
    "OMP_NUM_THREADS set to",
    "UserWarning",
    "] [    INFO]",
    "New Executor is Running",
    "DeprecationWarning",
)


@pytest.mark.gpu_wheel
def test_the_console_shows_no_paddle_chatter_unless_verbose(fmnist_root, tmp_path):
    command = [
        sys.executable,
        "train.py",
        *FAST_TRAIN,
        "--run-scope",
        "train_only",
        "--image-root",
        fmnist_root,
    ]
    # --verbose False (NVIDIA's spelling) is quiet: the value counts, not the flag's presence
    quiet_run = subprocess.run(
        command + ["--output-dir", str(tmp_path / "quiet"), "--verbose", "False"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert quiet_run.returncode == 0, quiet_run.stderr
    console = quiet_run.stdout + quiet_run.stderr
    assert not [word for word in CHATTER if word in console], console
    assert quiet_run.stderr == ""
    device = devices.describe(0 if devices.gpu_available() else None)
    # the allocator's line, then the model line: the demo's size is on PIR on Paddle 3
    # (CPU), the legacy IR on 2.6
    ir_label = "PIR" if paddle_internals.PADDLE3 and not devices.gpu_available() else "legacy IR"
    model_line = f"resnet18: 10 classes, rank 0/1, {device}, {ir_label}"
    first, second = quiet_run.stdout.splitlines()[:2]
    assert first.startswith("allocator: ") and second == model_line, quiet_run.stdout
    assert "summary" in quiet_run.stdout and "checkpoints" in quiet_run.stdout
    loud = subprocess.run(
        command + ["--output-dir", str(tmp_path / "loud"), "--verbose"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert loud.returncode == 0
    # Fleet's prints on the legacy IR, Paddle's warnings on PIR
    assert [word for word in CHATTER if word in loud.stdout + loud.stderr], loud.stdout


def test_a_checkpoint_replacement_left_by_a_dead_node_is_finished(trained, tmp_path):
    """Node B was killed between the two renames of replacing epoch 3, and the job
    restarted on node A: evaluation and resume must see epoch 3, not epoch 2, and the
    hidden folders must go."""
    arch = tmp_path / "resnet18"
    shutil.copytree(os.path.join(trained.run.output_dir, "resnet18"), arch)
    owner = "node-b-4242"
    shutil.copytree(arch / "3", arch / f".3.retired-{owner}")  # the replaced folder
    os.rename(arch / "3", arch / f".3.partial-{owner}")  # the complete new one
    (arch / f".3.lock-{owner}").touch()  # its lock, released
    assert ckpt.resolve_checkpoint(str(arch)) == str(arch / "3")
    assert ckpt.read_checkpoint(str(arch))[0]["epoch"] == 3
    assert sorted(os.listdir(arch)) == ["1", "2", "3"]


@once  # the console's lines are plain Python
def test_a_terminal_of_no_columns_gets_the_lines(fmnist_root, tmp_path):
    """tqdm draws nothing on a 0-column terminal (some schedulers' pseudo-terminals): the
    run prints its DLLogger lines there instead."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 0, 0, 0))
    command = [
        sys.executable,
        "train.py",
        *FAST_TRAIN,
        "--run-scope",
        "train_only",
        "--print-interval",
        "5",
        "--image-root",
        fmnist_root,
        "--output-dir",
        str(tmp_path),
    ]
    job = subprocess.Popen(command, cwd=ROOT, stdout=follower, stderr=follower)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert job.wait(timeout=300) == 0, output.decode()[-2000:]
    text = output.decode()
    assert "[LOG] epoch 1 step 5:" in text and "[LOG] epoch 1 step 10:" in text, text


def test_the_report_is_closed_when_a_step_raises(fmnist_root, tmp_path, monkeypatch):
    """An exception in the middle of a run (here: the first epoch) still closes the
    report: its file handle and VisualDL's writer, with what was logged on disk."""
    opened = []

    class WatchedReport(training_run.Report):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    def broken_epoch(*args, **kwargs):
        raise RuntimeError("a step failed")

    monkeypatch.setattr(training_run, "Report", WatchedReport)
    monkeypatch.setattr(epochs, "train_one_epoch", broken_epoch)
    config = small_config(fmnist_root, tmp_path / "out", **{"run.epochs": 1})
    with pytest.raises(RuntimeError, match="a step failed"):
        train.run(config, report_stream=open(os.devnull, "w"))
    assert len(opened) == 1 and opened[0]._handle is None
    with open(config.report_file) as handle:
        assert '"RUN"' in handle.readline() and '"PARAMETER"' in handle.readline()
