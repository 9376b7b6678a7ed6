"""--tracker tensorboard|mlflow|visualdl: one short real training run feeds all three, then
a resume continues it; each is read back with the tracker's own reader (TensorBoard's
EventAccumulator, MLflow's MlflowClient, VisualDL's LogReader) against the run's report."""

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.telemetry.client import get_telemetry_client
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from visualdl import LogReader

from conftest import once, run_command, small_config
from paddle_resnet.commands import train
from paddle_resnet.core import cli, trackers
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.report import read_report

# the trackers are no Paddle matter: on the pinned Paddle only
pytestmark = [
    once,
    pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated"),
]
ALL = ("tensorboard", "mlflow", "visualdl")
# the report's floats, as the trackers keep them (TensorBoard and VisualDL: float32)
CLOSE = {"rel": 1e-6}


def trained(fmnist_root, out, **values):
    """A run of ResNet-18 at 32 px (10 steps an epoch, logged every 5) into ``out`` with
    every tracker at its default place."""
    config = small_config(fmnist_root, out, **{"run.trackers": ALL, **values})
    train.run(config, report_stream=open(os.devnull, "w"))
    return config


@pytest.fixture(scope="module")
def runs(fmnist_root, tmp_path_factory):
    """(the first run's report records, its MLflow run id, the resumed run's config): one
    epoch, then a resume to two epochs, into one output folder."""
    out = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as environment:
        environment.delenv("MLFLOW_TRACKING_URI", raising=False)
        environment.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        first = trained(fmnist_root, out, **{"run.epochs": 1})
        records = read_report(first.report_file)
        first_run = json.loads((out / trackers.MLFLOW_RUN_FILE).read_text())["run_id"]
        events_of_first = os.listdir(out / "tensorboard")
        resumed = trained(fmnist_root, out, **{"run.epochs": 2, "run.from_checkpoint": "auto"})
    return records, first_run, events_of_first, resumed


def of_kind(records, kind):
    return [r for r in records if r["type"] == kind]


def tensorboard(out):
    events = EventAccumulator(
        str(out / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0}
    )
    events.Reload()
    return events


def mlflow_run(out):
    client = MlflowClient(tracking_uri=f"sqlite:///{out}/mlflow.db")
    run_id = json.loads((out / trackers.MLFLOW_RUN_FILE).read_text())["run_id"]
    return client, client.get_run(run_id)


def visualdl(out):
    """VisualDL's reader of the run's record file (a resume appends to it: VisualDL
    shows a folder's newest file only)."""
    (name,) = os.listdir(out / "visualdl")
    return LogReader(file_path=str(out / "visualdl" / name))


def image_shape(encoded):
    with Image.open(io.BytesIO(encoded)) as picture:
        return np.asarray(picture.convert("RGB")).shape


def test_each_tracker_holds_the_run(runs):
    """The first run as each tracker's reader sees it: the report's logged steps at their
    global steps, the validation (balanced top-1, each class's accuracy) at the epoch's
    last step, the confusion matrix as an image, the config as parameters, the
    checkpoint; read from the folder the resume then added to (its steps come after)."""
    records, _, _, config = runs
    out = Path(config.run.output_dir)
    logged = of_kind(records, "LOG")
    assert [r["step"] for r in logged] == [[1, 5], [1, 10]]
    val, classes = of_kind(records, "VAL")[0]["data"], of_kind(records, "CLASSES")[0]["data"]
    accuracy = dict(zip(classes["classes"], classes["accuracy"]))
    assert len(accuracy) == 10
    checkpoint = os.path.join(config.run.output_dir, "resnet18", "1")

    events = tensorboard(out)
    scalars = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    for key in ("loss", "top1", "top5", "lr", "ips", "loss_mean"):
        first_epoch = [e for e in scalars[f"train/{key}"] if e.step <= 10]
        assert [e.step for e in first_epoch] == [5, 10]
        assert [e.value for e in first_epoch] == pytest.approx(
            [r["data"][key] for r in logged], **CLOSE
        )
    for key in ("top1", "top5", "balanced_top1", "loss"):
        assert (scalars[f"val/{key}"][0].step, scalars[f"val/{key}"][0].value) == (
            10,
            pytest.approx(val[f"val.{key}"], **CLOSE),
        )
    for name, value in accuracy.items():
        assert scalars[f"val_class/{name}"][0].value == pytest.approx(value, **CLOSE)
    picture = events.Images(trackers.CONFUSION_TAG)[0]
    assert picture.step == 10 and image_shape(picture.encoded_image_string)[2] == 3
    assert picture.width > 300 and picture.height > 300
    parameters = events.Tensors("parameters/text_summary")[0].tensor_proto.string_val[0]
    assert b"| model.arch | resnet18 |" in parameters and b"| data.batch_size | 16 |" in parameters
    saved = [
        e.tensor_proto.string_val[0].decode() for e in events.Tensors("checkpoints/text_summary")
    ]
    assert saved[0] == checkpoint

    client, run = mlflow_run(out)
    params = run.data.params
    assert params["model.arch"] == "resnet18" and params["data.batch_size"] == "16"
    assert params["run.trackers"] == json.dumps(list(ALL)) and "ir.name" in params
    loss = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in loss][:2] == [
        (5, pytest.approx(logged[0]["data"]["loss"])),
        (10, pytest.approx(logged[1]["data"]["loss"])),
    ]
    top1 = client.get_metric_history(run.info.run_id, "val/balanced_top1")[0]
    assert (top1.step, top1.value) == (10, pytest.approx(val["val.balanced_top1"]))
    for name, value in accuracy.items():
        history = client.get_metric_history(run.info.run_id, f"val_class/{name}")
        assert history[0].value == pytest.approx(value)
    images = [a.path for a in client.list_artifacts(run.info.run_id, "images")]
    first_image = [p for p in images if p.endswith(".png") and "+step+10+" in p]
    assert len(first_image) == 1 and first_image[0].startswith("images/confusion_matrix+")
    local = client.download_artifacts(run.info.run_id, first_image[0])
    with open(local, "rb") as handle:
        assert image_shape(handle.read())[2] == 3
    assert run.data.tags["checkpoint.1"] == checkpoint

    visualdl_loss = visualdl(out).get_data("scalar", "train/loss")[:2]
    assert [p.id for p in visualdl_loss] == [5, 10]
    assert [p.value for p in visualdl_loss] == pytest.approx(
        [r["data"]["loss"] for r in logged], **CLOSE
    )


def test_a_resumed_run_continues_the_trackers_runs(runs):
    """The resume to epoch 2: the same MLflow run (its parameters the first start's, the
    changed epochs a tag), ended FINISHED; TensorBoard's steps continue from the global
    step in the same folder, a second event file beside the first; VisualDL's in the same
    file."""
    _, first_run, events_of_first, config = runs
    out = Path(config.run.output_dir)
    resumed = [r for r in read_report(config.report_file) if r["type"] == "LOG"][2:]
    assert [r["step"] for r in resumed] == [[2, 5], [2, 10]]

    client, run = mlflow_run(out)
    assert run.info.run_id == first_run and run.info.status == "FINISHED"
    runs_of_experiment = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs_of_experiment] == [first_run]
    assert run.data.params["run.epochs"] == "1" and run.data.tags["resume.run.epochs"] == "2"
    loss = client.get_metric_history(first_run, "train/loss")
    assert [m.step for m in loss] == [5, 10, 15, 20]
    assert [m.value for m in loss][2:] == pytest.approx([r["data"]["loss"] for r in resumed])
    val = client.get_metric_history(first_run, "val/top1")
    assert [m.step for m in val] == [10, 20]
    assert run.data.tags["checkpoint"] == os.path.join(config.run.output_dir, "resnet18", "2")

    assert len(events_of_first) == 1 and len(os.listdir(out / "tensorboard")) == 2
    events = tensorboard(out)
    assert [e.step for e in events.Scalars("train/loss")] == [5, 10, 15, 20]
    assert [e.value for e in events.Scalars("train/loss")][2:] == pytest.approx(
        [r["data"]["loss"] for r in resumed], **CLOSE
    )
    assert [e.step for e in events.Images(trackers.CONFUSION_TAG)] == [10, 20]
    assert [p.id for p in visualdl(out).get_data("scalar", "train/loss")] == [5, 10, 15, 20]


def log_record(trackers_of_run, epoch, step, loss):
    trackers_of_run.record(
        "LOG", [epoch, step], {"loss": loss, "progress": f"{step}/10", "lr": 0.1}
    )


def test_tensorboard_shows_what_each_start_continues(tmp_path):
    """A start logged steps 5-30 and was killed after its checkpoint at step 20; the next
    start resumes there and logs every 10 steps: TensorBoard's reader shows the first
    start's steps up to 20 and the resumed one's from there. An evaluation of that
    checkpoint puts its validation at step 20 and drops nothing; a fresh start in the
    folder replaces everything."""

    def start(saved_step, trains=True):
        return trackers.opened(["tensorboard"], str(tmp_path), None, None, None, saved_step, trains)

    killed = start(None)
    for step in (5, 10, 15, 20, 25, 30):
        log_record(killed, (step - 1) // 10 + 1, (step - 1) % 10 + 1, float(step))
    killed.close("KILLED")
    resumed = start(20)
    log_record(resumed, 3, 10, -30.0)
    resumed.close()
    loss = [(e.step, e.value) for e in tensorboard(tmp_path).Scalars("train/loss")]
    assert loss == [(5, 5.0), (10, 10.0), (15, 15.0), (20, 20.0), (30, -30.0)]

    evaluation = start(20, trains=False)
    evaluation.record("VAL", [2], {"val.top1": 0.5})
    evaluation.close()
    events = tensorboard(tmp_path)
    assert [(e.step, e.value) for e in events.Scalars("val/top1")] == [(20, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == loss

    fresh = start(None)
    log_record(fresh, 1, 5, 1.0)
    fresh.close()
    assert [(e.step, e.value) for e in tensorboard(tmp_path).Scalars("train/loss")] == [(5, 1.0)]


def test_a_tracker_that_fails_during_the_run_is_dropped_in_one_line(runs, tmp_path):
    """The MLflow run deleted while the run goes on (MLflow refuses to log to it): one
    warning line, and TensorBoard keeps every step. (In the store of the runs above, an
    experiment of its own: a new store takes seconds to set up.)"""
    uri = f"sqlite:///{runs[3].run.output_dir}/mlflow.db"
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("MLFLOW_EXPERIMENT_NAME", "failing")
        both = trackers.opened(
            ["mlflow", "tensorboard"], str(tmp_path), None, uri, None, None, True
        )
    log_record(both, 1, 5, 1.0)
    run_id = json.loads((tmp_path / trackers.MLFLOW_RUN_FILE).read_text())["run_id"]
    MlflowClient(tracking_uri=uri).delete_run(run_id)
    log_record(both, 1, 10, 2.0)
    both.close()
    lines = []
    while not both.warnings.empty():
        lines.append(both.warnings.get())
    assert len(lines) == 1 and lines[0].startswith("warning: --tracker mlflow failed and stops: ")
    assert [e.step for e in tensorboard(tmp_path).Scalars("train/loss")] == [5, 10]


def test_mlflow_reports_nothing_to_its_makers():
    """MLflow 3 sends usage reports to its makers' servers unless told not to; a process of
    the toolkit tells it (core/bootstrap.py), so this one, which imported mlflow after the
    package, has no telemetry client (strace of a run: no connection but local ones)."""
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert get_telemetry_client() is None


def test_tracker_flags():
    """--tracker repeats or takes a comma-separated list; an unknown one is refused."""
    config = cli.parse("train", ["--tracker", "mlflow", "--tracker", "tensorboard,visualdl"])
    assert config.run.trackers == ("mlflow", "tensorboard", "visualdl")
    with pytest.raises(UserError, match=r"--tracker\) must be one of tensorboard, mlflow"):
        cli.parse("train", ["--tracker", "wandb"])


def test_a_refused_tracking_uri_is_one_line(tmp_path):
    """MLflow 3's own refusal of its old folder store, as the run would say it before
    its first step."""
    uri = f"file://{tmp_path}/mlruns"
    with pytest.raises(UserError) as refused:
        trackers.opened(["mlflow"], str(tmp_path), None, uri, None, None, True)
    assert str(refused.value).startswith(f"--tracker mlflow at {uri}: ")
    assert "\n" not in str(refused.value)


def test_a_tracker_whose_package_is_missing_is_one_line():
    """train.py --tracker mlflow where mlflow is not installed (hidden from this process):
    the pip install in one line, status 2, before anything is read."""
    code = (
        "import sys; sys.modules['mlflow'] = None; from paddle_resnet.commands import train; "
        "sys.exit(train.main(['--tracker', 'tensorboard', '--tracker', 'mlflow', "
        "'--image-root', '/nonexistent']))"
    )
    result = run_command([sys.executable, "-c", code])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: run.trackers (--tracker) mlflow needs the optional package mlflow: "
        "pip install mlflow matplotlib"
    )
