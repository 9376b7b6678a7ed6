"""Runs that stop well: one run per output folder, Ctrl-C and SIGTERM with a checkpoint
at the step in flight and an exact resume, eval_only that names what it evaluated,
evaluation through the in-memory predictor. Real processes and real signals."""

import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import FAST_TRAIN, ROOT, flat, once
from paddle_resnet.commands import train
from paddle_resnet.core import atomic, optional
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.report import read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import eval_predictor, stopping

# Signals and locks do not depend on the Paddle version: run once, on 2.6.2.
pytestmark = once


def train_command(fmnist_root, output_dir, *extra):
    return [
        sys.executable,
        "-u",
        "train.py",
        *FAST_TRAIN[:-4],  # without --epochs 1 --warmup-epochs 0
        "--epochs",
        "2",
        "--warmup-epochs",
        "0",
        "--print-interval",
        "1",
        "--dali-num-threads",
        "1",
        "--image-root",
        fmnist_root,
        "--output-dir",
        str(output_dir),
        *extra,
    ]


def signalled(command, number, after, again=False):
    """Run ``command``, send ``number`` once its output holds ``after`` (twice with
    ``again``); (exit code, output)."""
    job = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines, sent = [], False
    for line in job.stdout:
        lines.append(line)
        if after in line and not sent:
            job.send_signal(number)
            if again:
                job.send_signal(number)
            sent = True
    return job.wait(timeout=300), "".join(lines)


def test_sigterm_saves_at_the_step_and_the_resume_is_exact(fmnist_root, tmp_path):
    """SIGTERM in the middle of epoch 1: the step in flight finishes, a checkpoint at
    that step, one line with the resume command, exit 143; the resumed run ends with the
    weights of a run never stopped, bit for bit."""
    code, output = signalled(
        train_command(fmnist_root, tmp_path / "stopped"), signal.SIGTERM, "epoch 1 step 3:"
    )
    assert code == 143, output[-2000:]
    assert "Traceback" not in output and "FatalError" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM in epoch 1 after step ")
    resume = last.split("resume with: ")[1].split()
    saved = resume[-1]
    meta, _ = ckpt.read_checkpoint(saved)
    assert meta["epoch"] == 0 and 3 <= meta["step_in_epoch"] < 10
    resumed = subprocess.run(
        [sys.executable, *resume[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"step {meta['step_in_epoch']} of epoch 1" in resumed.stdout
    straight = subprocess.run(
        train_command(fmnist_root, tmp_path / "straight"),
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert straight.returncode == 0
    final = [
        ckpt.read_checkpoint(str(tmp_path / run / "resnet18" / "2"))[1]
        for run in ("stopped", "straight")
    ]
    assert set(final[0]) == set(final[1])
    for name in final[1]:
        np.testing.assert_array_equal(final[0][name], final[1][name], err_msg=name)
    stops = [
        r for r in read_report(str(tmp_path / "stopped" / "report.json")) if r["type"] == "STOPPED"
    ]
    assert stops[0]["data"]["checkpoint"] == saved
    runs = [r for r in read_report(str(tmp_path / "stopped" / "report.json")) if r["type"] == "RUN"]
    assert len(runs) == 2  # each run's lines begin with its RUN record


def test_the_first_signal_asks_to_stop_its_repeats_are_one_request_a_later_one_ends_it():
    """A first SIGINT is a request (the run finishes its step and saves); signals within
    REPEATS_SECONDS of it are the same request (the launcher's burst of SIGTERMs, Ctrl-C
    reaching launcher and ranks); a later one ends the process at once, with the default
    action and without a traceback. A real process signals itself."""
    code = (
        "import os, signal, time\n"
        "from paddle_resnet.training import stopping\n"
        "with stopping.StopRequests() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
        "    print(stop.received, stop.should_stop(), stop.signal_number, flush=True)\n"
        "    time.sleep(stopping.REPEATS_SECONDS)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
        "    print('still running')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert result.stdout.split() == [str(int(signal.SIGINT)), "True", str(int(signal.SIGINT))]
    assert "Traceback" not in result.stderr


def test_the_resume_command_of_a_launched_rank_starts_the_launcher():
    argv = ["train.py", "--epochs", "2", "--from-checkpoint", "old"]
    assert stopping.resume_command("out/resnet18/1-step3", argv, {}) == (
        "python train.py --epochs 2 --from-checkpoint out/resnet18/1-step3"
    )
    launched = {"PADDLE_TRAINERS_NUM": "8", "PADDLE_LOCAL_SIZE": "4", "PADDLE_NNODES": "2"}
    launched["PADDLE_MASTER"] = "10.0.0.1:8090"
    assert stopping.resume_command("d", argv, launched) == (
        "python -m paddle.distributed.launch --nnodes 2 --master 10.0.0.1:8090 "
        "--nproc_per_node 4 train.py --epochs 2 --from-checkpoint d"
    )


def test_a_second_run_into_one_output_folder_is_refused_naming_the_first(
    fmnist_root, tmp_path, capsys
):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from paddle_resnet.core import atomic\n"
            "with atomic.run_lock(sys.argv[1], 'x'):\n    print('held', flush=True); time.sleep(120)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    argv = list(FAST_TRAIN) + ["--image-root", fmnist_root, "--output-dir", str(tmp_path)]
    assert train.main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        f"--output-dir {tmp_path} is in use by a run on {socket.gethostname()} pid {holder.pid}"
        in error
    )
    assert not os.path.exists(tmp_path / "resnet18")
    holder.kill()
    holder.wait()
    with atomic.run_lock(str(tmp_path), "x"):  # a dead holder's lock is taken over
        with pytest.raises(UserError, match="in use by a run on"):
            with atomic.run_lock(str(tmp_path), "x"):
                pass


def test_an_export_into_a_folder_being_written_is_refused(tmp_path):
    with atomic.export_lock(str(tmp_path / "model"), "--inference-dir model"):
        with pytest.raises(UserError, match="--inference-dir model is in use by a run on"):
            with atomic.export_lock(str(tmp_path / "model"), "--inference-dir model"):
                pass


def test_eval_only_names_its_checkpoint_and_matches_the_executor(
    trained, tmp_path, capsys, monkeypatch
):
    """eval_only says which checkpoint and epoch it evaluated; its evaluation through
    the in-memory predictor gives the executor's loss and top-1."""
    values = dict(
        flat(trained),
        **{
            "run.run_scope": "eval_only",
            "run.output_dir": str(tmp_path / "fast"),
            "run.from_checkpoint": ckpt.checkpoint_dir(trained.run.output_dir, "resnet18", 3),
        },
    )
    fast = train.run(build_config(values))
    out = capsys.readouterr().out
    assert f"evaluating checkpoint {values['run.from_checkpoint']} (epoch 3)" in out
    records = read_report(str(tmp_path / "fast" / "report.json"))
    assert [r["step"] for r in records if r["type"] == "VAL"] == [[3]]
    monkeypatch.setattr(eval_predictor, "usable", lambda config, on_gpu: False)
    values["run.output_dir"] = str(tmp_path / "executor")
    slow = train.run(build_config(values))
    assert fast["val.top1"] == slow["val.top1"]
    np.testing.assert_allclose(fast["val.loss"], slow["val.loss"], rtol=1e-4)


def test_an_optional_package_that_does_not_import_is_one_line(tmp_path, monkeypatch):
    """An installed optional package whose own import fails (e.g. onnxruntime.quantization
    without ml_dtypes) is named with the install command, not a traceback."""
    broken = tmp_path / "onnxruntime"
    broken.mkdir()
    (broken / "__init__.py").write_text("import a_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "onnxruntime", raising=False)
    with pytest.raises(UserError, match="installed but does not import .*requirements-tools.txt"):
        optional.require("onnxruntime", "the ONNX peer")
