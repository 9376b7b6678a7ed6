"""A run that diverges stops at its step in one line, with status 2, and saves nothing
that is not finite (``training/divergence.py``): a learning rate far too high on both
IRs, with and without validation; a stop by signal once the weights are nan; a resume
from a checkpoint holding nan (refused at load); AMP's dynamic loss scaling, whose
skipped steps may fetch a nan loss, goes on."""

import glob
import hashlib
import json
import os
import pickle
import signal
import sys

import numpy as np
import paddle
import pytest

from conftest import FAST_TRAIN, PADDLE3, launch, once, run_command, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import bootstrap, errors
from paddle_resnet.core.config import build_config
from paddle_resnet.core.report import Report, read_report
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import divergence, epochs, ir, lifecycle, prepare, programs, run_folder
from paddle_resnet.training.loop import train_step
from paddle_resnet.training.session import Session

# ResNet-18 at 32 px, 10 steps of 16 images an epoch: at this LR the loss is nan within
# the first epoch (step 3 on the legacy IR, 6 on PIR).
DIVERGING = [*FAST_TRAIN, "--lr", "1e9", "--print-interval", "1", "--dali-num-threads", "1"]


def diverged_line(stderr):
    """The run's one error line: the divergence, with the step and what to change."""
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    line = lines[0]
    assert line.startswith("error: training diverged in epoch 1 at step "), line
    assert "the loss is nan at learning rate " in line
    assert "nothing non-finite was saved; no checkpoint of this run yet" in line
    assert "To change: lower --lr (now 1e+09 per 256 images) or lengthen --warmup-epochs" in line
    return line


def nothing_saved(out):
    assert not os.path.exists(os.path.join(out, "resnet18")), os.listdir(out)


def last_logged_step(out):
    """(epoch, step) of the report's DIVERGED record; the LOG record of that step has the
    nan loss."""
    records = read_report(os.path.join(out, "report.json"))
    diverged = [r for r in records if r["type"] == "DIVERGED"]
    assert len(diverged) == 1
    logs = [r for r in records if r["type"] == "LOG"]
    assert logs[-1]["step"] == diverged[0]["step"] and np.isnan(logs[-1]["data"]["loss"])
    assert all(np.isfinite(r["data"]["loss"]) for r in logs[:-1])
    return tuple(diverged[0]["step"])


@once
def test_a_diverging_run_stops_at_its_step_with_status_2(fmnist_root, tmp_path):
    """train.py as users run it, training and validating: no checkpoint of nan weights, no
    evaluation (whose predictor failed on them with a traceback), status 2, which the Slurm
    scripts and the manifests do not retry."""
    out = tmp_path / "out"
    result = run_command(
        [sys.executable, "train.py", *DIVERGING, "--image-root", fmnist_root]
        + ["--output-dir", str(out), "--ir", "legacy"]
    )
    assert result.returncode == errors.USER_ERROR, result.stderr[-3000:]
    line = diverged_line(result.stderr)
    epoch, step = last_logged_step(out)
    assert line.startswith(f"error: training diverged in epoch {epoch} at step {step} of 10:")
    assert "validation" not in result.stdout
    nothing_saved(out)


@pytest.mark.parametrize(
    "ir_name",
    [
        "legacy",
        pytest.param("pir", marks=pytest.mark.skipif(not PADDLE3, reason="PIR needs Paddle 3")),
    ],
)
def test_a_diverging_train_only_run_stops_too(fmnist_root, tmp_path, capsys, ir_name):
    """--run-scope train_only, which ended with status 0 and nan weights saved."""
    if ir_name == "legacy" and bootstrap.pir_only():
        pytest.skip("the legacy IR is unavailable in the PIR-only rehearsal")
    out = tmp_path / "out"
    argv = [*DIVERGING, "--image-root", fmnist_root, "--output-dir", str(out)]
    status = train.main([*argv, "--run-scope", "train_only", "--ir", ir_name])
    assert status == errors.USER_ERROR
    diverged_line(capsys.readouterr().err)
    last_logged_step(out)
    nothing_saved(out)


@pytest.fixture
def session(fmnist_root, tmp_path):
    """A one-process training Session of ResNet-18 (programs prepared, a report open), as
    ``run.run`` builds it, in a scope of its own."""
    config = small_config(fmnist_root, tmp_path / "out", **{"run.run_scope": "train_only"})
    os.makedirs(config.run.output_dir)
    with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
        built, exe = prepare.ready_for_weights(config, True, 1, 10, paddle.CPUPlace())
        with Report(config.report_file, stream=open(os.devnull, "w")) as report:
            yield Session(
                config=config,
                exe=exe,
                programs=built,
                report=report,
                rank=0,
                world_size=1,
                place=paddle.CPUPlace(),
                device_id=None,
                all_reduce=None,
                classes=tuple(str(i) for i in range(10)),
                steps_per_epoch=10,
                checkpoints=run_folder.Checkpoints(os.path.join(config.run.output_dir, "resnet18")),
            )


def poison(name):
    """Put nan into the variable ``name`` of the global scope."""
    tensor = paddle.static.global_scope().find_var(name).get_tensor()
    value = np.array(tensor)
    value.flat[0] = np.nan
    tensor.set(value, paddle.CPUPlace())


def test_a_stop_by_signal_never_saves_weights_that_are_not_finite(session):
    """SIGTERM at a step whose update made a weight nan (its loss, computed before the
    update, still finite): the stop's checkpoint is not written, the run ends diverged."""
    train_program = session.programs.train
    weight = ir.parameters(train_program)[0].name
    watch = divergence.Watch(session.config, train_program)
    saves = run_folder.Saves(session, (0, 0), watch)
    stop = lifecycle.StepAgreement()
    stop.signal_number = signal.SIGTERM
    with pytest.raises(lifecycle.Stopped):  # finite: saved, then the stop
        epochs._stopped(session, saves, 1, 3, stop)
    saved = os.path.join(session.config.run.output_dir, "resnet18", "1-step3")
    assert os.path.isdir(saved) and watch.last_finite == saved
    poison(weight)
    with pytest.raises(errors.Diverged) as refused:
        epochs._stopped(session, saves, 1, 4, stop)
    assert str(refused.value).startswith(
        f"training diverged in epoch 1 at step 4, stopped by a signal: {weight} holds nan or "
        f"inf values; nothing non-finite was saved; the last finite checkpoint: {saved} "
        f"(--from-checkpoint {saved} once changed)."
    )
    assert not os.path.exists(os.path.join(os.path.dirname(saved), "1-step4"))


def test_a_checkpoint_holding_nan_is_refused_at_resume(session, tmp_path, capsys):
    """A checkpoint whose weights hold nan (the session's own, made so by hand: the toolkit
    writes none) is refused in one line naming the tensor, status 2, before any step."""
    damaged = os.path.join(session.config.run.output_dir, "resnet18", "1")
    watch = divergence.Watch(session.config, session.programs.train)
    assert run_folder.Saves(session, (0, 0), watch).save(1, 0) == damaged
    params = os.path.join(damaged, "model.pdparams")
    state = ckpt.read_pickle(params)
    name = sorted(key for key, value in state.items() if isinstance(value, np.ndarray))[0]
    state[name] = np.full_like(state[name], np.nan)
    with open(params, "wb") as handle:
        pickle.dump(state, handle, protocol=4)
    meta_path = os.path.join(damaged, ckpt.META)
    with open(meta_path) as handle:
        meta = json.load(handle)
    with open(params, "rb") as handle:
        meta["files"]["model.pdparams"] = {
            "bytes": os.path.getsize(params),
            "sha256": hashlib.sha256(handle.read()).hexdigest(),
        }
    with open(meta_path, "w") as handle:
        json.dump(meta, handle)
    out = tmp_path / "resumed"
    values = dict(session.config.flat(), **{"run.from_checkpoint": damaged})
    values["run.output_dir"] = str(out)
    status = errors.exit_status(
        lambda: train.run(build_config(values), report_stream=open(os.devnull, "w"))
    )
    assert status == errors.USER_ERROR
    assert capsys.readouterr().err.strip() == (
        f"error: {params}: tensor {name!r} holds {state[name].size} nan or inf values (of "
        f"{state[name].size}): weights that are not finite give nan outputs; the run that "
        "wrote them diverged"
    )
    assert not glob.glob(str(out / "resnet18" / "*"))


@pytest.mark.skipif(bootstrap.pir_only(), reason="Fleet's AMP: the legacy IR")
def test_a_step_that_dynamic_loss_scaling_skips_is_no_divergence():
    """Fleet's AMP with dynamic loss scaling (on the CPU build only its loss-scaling ops:
    fp32 computing, the same skip): logits that overflow make the loss nan, AMP skips the
    update and the weights stay finite; the watch lets the run go on. Without dynamic
    scaling the same step is a divergence. (PIR's GradScaler is found by the same op,
    ``ir.loss_scaling_overflow``; PIR builds fp16 AMP only on the GPU build: not run here.)"""
    rng = np.random.default_rng(0)
    feed = {
        "data": rng.random((8, 3, 32, 32)).astype("float32"),
        "label": rng.integers(0, 10, (8, 1)).astype("int64"),
    }
    base = {
        "run.ir": "legacy",
        "model.arch": "resnet18",
        "model.num_classes": 10,
        "data.crop_size": 32,
        "lr.warmup_epochs": 0.0,
        "run.cpu_onednn": False,
    }
    steps = {}
    for dynamic in (True, False):
        config = build_config(
            dict(base, **{"amp.enabled": dynamic, "amp.use_dynamic_loss_scaling": dynamic})
        )
        with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
            built = programs.build_programs(config, steps_per_epoch=10, global_batch=8)
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(built.startup)
            watch = divergence.Watch(config, built.train)
            assert (divergence.AMP_SKIPPED in watch.fetches) == dynamic
            classifier = [p.name for p in ir.parameters(built.train) if p.name.startswith("linear")]
            scope = paddle.static.global_scope()
            for name in classifier:  # logits beyond float32's range
                tensor = scope.find_var(name).get_tensor()
                tensor.set(np.full(np.array(tensor).shape, 1e37, "float32"), paddle.CPUPlace())
            steps[dynamic] = train_step(exe, built, feed, fetches=watch.fetches)
            steps[dynamic]["finite"] = divergence.first_non_finite(built.train) is None
    skipped = steps[True]
    assert np.isnan(skipped["loss"]) and skipped[divergence.AMP_SKIPPED] == 1.0
    assert skipped["finite"] and not divergence.Watch.step_diverged(skipped)
    assert np.isnan(steps[False]["loss"]) and divergence.Watch.step_diverged(steps[False])


@once
def test_every_rank_of_a_diverging_job_stops_at_the_same_step(fmnist_root, tmp_path):
    """Two ranks under the launcher: the ranks agree on the step (the per-step stop
    all-reduce), each says so in its log, the job ends with 2, nothing is saved."""
    out = tmp_path / "out"
    result = launch(
        ["train.py", *DIVERGING, "--epochs", "2", "--image-root", fmnist_root]
        + ["--output-dir", str(out)]
        + ["--ir", "legacy"],
        tmp_path / "logs",
    )
    assert result.returncode == errors.USER_ERROR, (result.stdout[-2000:], result.stderr[-2000:])
    where = set()
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"workerlog.{rank}").read_text()
        lines = [line for line in log.splitlines() if line.startswith("error: training diverged")]
        assert len(lines) == 1 and "Traceback" not in log, log[-3000:]
        # which check sees it first is the numerics' choice (on an AMX Xeon the loss stayed
        # finite while the BN statistics went nan): the step's loss, agreed by the ranks,
        # or the weights at the epoch's end, agreed by the ranks
        assert " of 2 ranks) at learning rate " in lines[0] or (
            "holds nan or inf values on rank " in lines[0]
        ), lines[0]
        where.add(lines[0].split(":")[1])
    # " training diverged in epoch E at step S of 5" or " ... by the end of epoch E"
    assert len(where) == 1, where
    nothing_saved(out)


def rank_lines(logs, start):
    """Each rank's lines that begin with ``start``, and whether its log holds a traceback."""
    found = {}
    for rank in (0, 1):
        log = (logs / f"workerlog.{rank}").read_text()
        found[rank] = ([line for line in log.splitlines() if line.startswith(start)], log)
    return found


@once
def test_what_one_rank_alone_finds_ends_every_rank_alike(fmnist_root, tmp_path):
    """Two ranks, a fault planted in rank 1 alone after its 2nd step
    (tests/ranks/device_fault.py): its batch norm's running statistics nan (each rank keeps
    its own; the loss stays finite), then, in a second job, one of its weights changed (a
    bit flipped in memory: the ranks' parameters differ). Each is the job's decision at the
    epoch's end: every rank ends with the same status, 2 (diverged: no restart helps) or
    75 (a hardware fault: restart from the last checkpoint), each with one line naming
    the fault (rank 1's tensor), nothing saved. Before, rank 1 alone ended with 2 and rank
    0 saved and then waited in the next collective until it was killed."""
    args = ["tests/ranks/device_fault.py", *FAST_TRAIN, "--image-root", fmnist_root]
    args += ["--dali-num-threads", "1", "--run-scope", "train_only", "--ir", "legacy"]
    cases = (
        ("non-finite-statistics", errors.USER_ERROR, "error: training diverged by the end"),
        ("flipped-parameter", errors.RESTARTABLE, "error: the 2 ranks hold different"),
    )
    for kind, status, start in cases:
        out, logs = tmp_path / kind, tmp_path / f"{kind}-logs"
        env = {"PADDLE_RESNET_FAULT": f"{kind}@2", "PADDLE_RESNET_FAULT_RANK": "1"}
        result = launch([*args, "--output-dir", str(out)], logs, env=env, timeout=240)
        assert result.returncode == status, (kind, result.stdout[-2000:], result.stderr[-2000:])
        lines = rank_lines(logs, start)
        assert sorted(lines) == [0, 1]
        for rank, (found, log) in lines.items():
            assert len(found) == 1 and "Traceback" not in log, (kind, rank, log[-3000:])
        assert lines[0][0] == lines[1][0], lines  # the same line on every rank
        line = lines[0][0][0]
        if kind == "non-finite-statistics":
            assert ".w_1 holds nan or inf values on rank 1 (of 2 ranks, the only one)" in line
        else:
            assert "after epoch 1" in line and "a hardware fault" in line, line
        nothing_saved(out)


@pytest.mark.cuda_build
@pytest.mark.parametrize("pure_fp16", [False, True], ids=["O1", "O2"])
def test_the_gpu_programs_of_dynamic_loss_scaling_give_their_skip_flag(pure_fp16):
    """Fleet's fp16 AMP built for a GPU (the GPU build, with or without one): the flag the
    watch fetches is found in the train program (run only where a GPU is)."""
    config = build_config(
        {
            "run.ir": "legacy",
            "model.arch": "resnet18",
            "model.num_classes": 10,
            "data.crop_size": 32,
            "amp.enabled": True,
            "amp.use_dynamic_loss_scaling": True,
            "amp.use_pure_fp16": pure_fp16,
        }
    )
    with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
        built = programs.build_programs(config, steps_per_epoch=10, global_batch=8, on_gpu=True)
        flag = divergence.Watch(config, built.train).fetches[divergence.AMP_SKIPPED]
        assert str(flag.dtype).lower().endswith("bool") and tuple(flag.shape) in ((1,), ())
