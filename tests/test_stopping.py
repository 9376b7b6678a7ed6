"""Runs that stop well: one run per output folder, Ctrl-C and SIGTERM with a checkpoint
at the step in flight and an exact resume, eval_only that names what it evaluated,
evaluation through the in-memory predictor. Real processes and real signals."""

import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import (
    FAST_TRAIN,
    ROOT,
    assert_same_state,
    flat,
    interrupted,
    once,
    pir_rehearsal,
    random_seed,
    train_command,
)
from paddle_resnet.commands import train
from paddle_resnet.core import atomic, optional
from paddle_resnet.core.config import build_config
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.report import read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import eval_predictor, lifecycle, run_folder

# Signals and locks do not depend on the Paddle version: run once, on 2.6.2.
pytestmark = once


STEPS_PER_EPOCH = 10  # train_command: 160 images, batch 16


@pir_rehearsal
def test_the_same_command_continues_after_kills_and_stops_bit_identical(
    fmnist_root, tmp_path, uninterrupted
):
    """What a scheduler does (Slurm's requeue, a pod restart): the job is stopped (SIGTERM:
    it saves at the step in flight) or killed outright (SIGKILL: node lost, OOM, the
    grace period over) at random moments, and started again with the same command line,
    --from-checkpoint auto. It ends with the weights of a run never stopped, bit for bit;
    --keep-checkpoints 1 leaves the final checkpoint and the one the last start resumed
    from."""
    seed = random_seed()
    rng = random.Random(seed)
    steps = sorted(rng.sample(range(1, 2 * STEPS_PER_EPOCH - 1), 3))  # each before the end
    plan = [(signal.SIGKILL, steps[0]), (signal.SIGTERM, steps[1]), (signal.SIGKILL, steps[2])]
    out = tmp_path / "job"
    command = train_command(
        fmnist_root, out, "--from-checkpoint", "auto", "--keep-checkpoints", "1"
    )
    same_command = shlex.join(["python", *command[2:]])
    outputs = []
    for attempt, (number, step) in enumerate(plan):
        why = f"seed {seed}, plan {plan}, attempt {attempt}"
        saved = ckpt.saved_checkpoints(str(out / "resnet18"))
        code, output = interrupted(command, number, step)
        outputs.append(output)
        assert "Traceback" not in output and "FatalError" not in output, (why, output[-3000:])
        if saved:
            assert f"--from-checkpoint auto: {saved[-1][1]}, the newest" in output, why
        else:
            assert f"--from-checkpoint auto: no checkpoint in {out}/resnet18 yet" in output, why
        if number == signal.SIGKILL:
            assert code == -signal.SIGKILL, (why, output[-3000:])
            continue
        assert code == 143, (why, output[-3000:])
        last = output.strip().splitlines()[-1]
        assert last.startswith("stopped by SIGTERM in epoch "), (why, last)
        assert last.endswith(f"resume with: {same_command}"), (why, last)
        saved = last.split(": saved ")[1].split(";")[0]
        meta, _ = ckpt.read_checkpoint(saved)
        assert meta["global_step"] >= step, why
    final = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    resumed = re.search(r"--from-checkpoint auto: \S+/(\S+), the newest", final.stdout)[1]
    # --keep-checkpoints 1, and the checkpoint the start that saved "2" resumed from (never
    # removed by that run: a kill right after the save, before its end, left it; a finished
    # run started again trains nothing and removes nothing)
    starts = re.findall(r"--from-checkpoint auto: \S+/(\S+), the newest", "\n".join(outputs))
    kept = set(os.listdir(out / "resnet18"))
    assert {"2", resumed} <= kept <= {"2", resumed, *starts[-1:]}, (seed, kept, starts)
    try:
        assert_same_state(ckpt.read_checkpoint(str(out / "resnet18" / "2"))[1], uninterrupted)
    except AssertionError:  # which plan and starts, to replay (RANDOM_MOMENTS_SEED)
        print(f"seed {seed}, plan {plan}, starts {starts}", *outputs, final.stdout, sep="\n")
        raise
    runs = [r for r in read_report(str(out / "report.json")) if r["type"] == "RUN"]
    assert len(runs) == len(plan) + 1  # each run's lines begin with its RUN record


@pir_rehearsal
def test_a_validation_changes_nothing_in_the_training_after_it(
    fmnist_root, tmp_path, uninterrupted
):
    """Paddle Inference, which validates on the CPU, ends each run with the process's MKL
    and OpenMP on one thread: the training after a validation ran on one core and rounded
    unlike the same run resumed after that validation (PIR, oneDNN kernels: 0.05 apart
    after 4 steps). The run without its validation ends with the same weights, bit for bit."""
    out = tmp_path / "job"
    command = train_command(fmnist_root, out, "--run-scope", "train_only")
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "val.top1" not in (out / "report.json").read_text()
    assert_same_state(ckpt.read_checkpoint(str(out / "resnet18" / "2"))[1], uninterrupted)


def test_a_kill_after_a_timed_save_resumes_from_it_bit_identical(
    fmnist_root, tmp_path, uninterrupted
):
    """--save-every-minutes: a checkpoint within the epoch once the time has passed, so a
    node lost without a signal (SIGKILL) costs at most that long: the same command
    resumes from the timed checkpoint and ends with the weights of a run never stopped."""
    out = tmp_path / "job"
    # 0.003 minutes (0.18 s): a save every few steps of this small run
    command = train_command(fmnist_root, out, "--from-checkpoint", "auto")
    command += ["--save-every-minutes", "0.003"]
    job = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in job.stdout:
        lines.append(line)
        timed = re.search(r"saved \S+/resnet18/(2-step\d+)$", line.strip())
        if timed:  # a timed save within the second epoch
            job.kill()
            break
    job.wait(timeout=60)
    assert timed, "".join(lines)[-3000:]
    assert re.search(r"saved \S+/resnet18/1-step\d+\n", "".join(lines))  # within epoch 1 too
    final = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    assert f"--from-checkpoint auto: {out}/resnet18/{timed[1]}, the newest" in final.stdout
    assert_same_state(ckpt.read_checkpoint(str(out / "resnet18" / "2"))[1], uninterrupted)
    # timed checkpoints are superseded by the next save, even with every epoch kept (but
    # the one this start resumed from: retention never removes it)
    assert sorted(os.listdir(out / "resnet18")) == ["1", "2", timed[1]]


def test_sigterm_saves_at_the_step_in_flight(fmnist_root, tmp_path):
    """SIGTERM in the middle of epoch 1 (a command without auto): the step in flight
    finishes, a checkpoint at that step, one line naming the resume command with that
    checkpoint, exit 143."""
    code, output = interrupted(train_command(fmnist_root, tmp_path / "stopped"), signal.SIGTERM, 3)
    assert code == 143, output[-2000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM in epoch 1 after step ")
    saved = last.split("resume with: ")[1].split()[-1]
    meta, _ = ckpt.read_checkpoint(saved)
    assert meta["epoch"] == 0 and 3 <= meta["step_in_epoch"] < STEPS_PER_EPOCH
    assert os.path.basename(saved) == f"1-step{meta['step_in_epoch']}"
    stops = [
        r for r in read_report(str(tmp_path / "stopped" / "report.json")) if r["type"] == "STOPPED"
    ]
    assert stops[0]["data"]["checkpoint"] == saved


def test_the_first_signal_asks_to_stop_sigterms_never_end_it_a_second_ctrl_c_does():
    """A first SIGINT is a request (the run finishes its step and saves); SIGTERMs, however
    late, are the same request (the launcher's burst, Slurm signalling every process: a
    handler may run a whole step after its signal arrived); a SIGINT more than
    REPEATS_SECONDS after the first (Ctrl-C pressed again) ends the process at once, with
    the default action and without a traceback. A real process signals itself."""
    code = (
        "import os, signal, time\n"
        "from paddle_resnet.training import lifecycle\n"
        "with lifecycle.StepAgreement() as stop:\n"
        "    os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
        "    print(stop.received, stop.should_stop(), stop.signal_number, flush=True)\n"
        "    time.sleep(lifecycle.REPEATS_SECONDS)\n"
        "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
        "    print('still running', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "    print('not reached')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == -signal.SIGINT, result.stderr[-2000:]
    assert result.stdout.split("\n")[:2] == [
        f"{int(signal.SIGINT)} True {int(signal.SIGINT)}",
        "still running",
    ]
    assert "Traceback" not in result.stderr


def test_the_resume_command_of_a_launched_rank_starts_the_launcher():
    argv = ["train.py", "--epochs", "2", "--from-checkpoint", "old"]
    assert lifecycle.resume_command("out/resnet18/1-step3", argv, {}) == (
        "python train.py --epochs 2 --from-checkpoint out/resnet18/1-step3"
    )
    auto = ["train.py", "--epochs", "2", "--from-checkpoint", "auto"]
    assert (
        lifecycle.resume_command("d", auto, {})
        == "python train.py --epochs 2 --from-checkpoint auto"
    )
    launched = {"PADDLE_TRAINERS_NUM": "8", "PADDLE_LOCAL_SIZE": "4", "PADDLE_NNODES": "2"}
    launched["PADDLE_MASTER"] = "10.0.0.1:8090"
    assert lifecycle.resume_command("d", argv, launched) == (
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


@pir_rehearsal
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
            "run.from_checkpoint": run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3),
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
