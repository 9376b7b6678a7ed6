"""Experiment trackers beside the report (``--tracker tensorboard|mlflow|visualdl``): the
run's Report (core/report.py) hands every record it writes to ``Trackers``, which turns
them into what each tracker shows:

- each logged training step's values (loss, top-1/5, learning rate, images/s, timings and
  their means) as ``train/<name>`` scalars at the run's global step;
- each validation's values as ``val/<name>`` (top-1/5, balanced top-1, loss), each class's
  accuracy as ``val_class/<class>`` and the confusion matrix (the most confused pairs
  beyond 100 classes) as the image ``confusion_matrix``, at the global step of the
  validated epoch's last step (an evaluation before any training step: at the step its
  checkpoint was saved at);
- the resolved configuration (the report's PARAMETER record) as parameters,
  ``section.key`` flattened;
- each checkpoint saved (``Report.saved``): MLflow tags ``checkpoint`` (the newest) and
  ``checkpoint.<name>``, a text entry ``checkpoints`` for TensorBoard and VisualDL.

Rank 0 only: other ranks' Reports get none. The writing happens on one background
thread, so a step never waits on a tracker's disk or server; a tracker that fails while
the run goes on is dropped with one warning line, the run continues. A resumed run
continues the tracker's run: TensorBoard and VisualDL write into the same folder at the
global steps the run continues from (TensorBoard's readers drop the events an earlier
start wrote past the checkpoint this one resumes: a run killed after its last checkpoint
does not leave two curves); MLflow's run id is kept in ``<output-dir>/mlflow_run.json``
and that run is resumed (its parameters stay the first start's; a value a resumed start
changed becomes the tag ``resume.<key>``).
"""

import contextlib
import io
import itertools
import json
import logging
import os
import queue
import re
import sys
import threading
import time

from paddle_resnet.core import bootstrap, optional
from paddle_resnet.core.atomic import atomic_files
from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import require
from paddle_resnet.core.plots import confusion_picture

# tracker -> ({module it needs: installed}, the pip command that installs them); the
# confusion image is drawn with matplotlib
REQUIREMENTS = {
    "tensorboard": (
        {"tensorboardX": optional.has_tensorboardx, "matplotlib": optional.has_matplotlib},
        "pip install tensorboardX tensorboard matplotlib",
    ),
    "mlflow": (
        {"mlflow": optional.has_mlflow, "matplotlib": optional.has_matplotlib},
        "pip install mlflow matplotlib",
    ),
    "visualdl": (
        {"visualdl": optional.has_visualdl, "matplotlib": optional.has_matplotlib},
        "pip install visualdl matplotlib",
    ),
}
TRACKERS = tuple(REQUIREMENTS)
MLFLOW_RUN_FILE = "mlflow_run.json"
MLFLOW_EXPERIMENT = "paddle-resnet"
CONFUSION_TAG = "confusion_matrix"
# seconds between the event writers' flushes: what a person watching waits at most
FLUSH_SECONDS = 10
# a count of this process's event writers, in their file names
_WRITERS = itertools.count()
# characters MLflow refuses in a metric or tag name (a class folder may hold any)
_UNSAFE_NAME = re.compile(r"[^\w\-. /:]")


def unusable(name):
    """Why tracker ``name`` cannot run here (unknown, or its missing packages and the
    command that installs them), or None: the check of ``--tracker``."""
    if name not in REQUIREMENTS:
        return f"must be one of {', '.join(TRACKERS)}, got {name!r}"
    modules, install = REQUIREMENTS[name]
    missing = [optional.PACKAGES[module] for module, present in modules.items() if not present]
    if not missing:
        return None
    plural = "s" if len(missing) > 1 else ""
    return f"{name} needs the optional package{plural} {' and '.join(missing)}: {install}"


def mlflow_tracking_uri(given, output_dir):
    """Where MLflow writes: ``given`` (--mlflow-tracking-uri), else MLFLOW_TRACKING_URI,
    else a local SQLite store in the output folder (no server; MLflow 3 refuses its old
    folder store unless MLFLOW_ALLOW_FILE_STORE is set)."""
    return (
        given
        or os.environ.get("MLFLOW_TRACKING_URI")
        or "sqlite:///" + os.path.join(os.path.abspath(output_dir), "mlflow.db")
    )


def flattened(data, prefix=""):
    """{"section.key": text} of a nested record: strings as they are, other values as JSON."""
    flat = {}
    for name, value in data.items():
        if isinstance(value, dict):
            flat.update(flattened(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value if isinstance(value, str) else json.dumps(value)
    return flat


def _numbers(data, prefix):
    """The record's numeric values as {prefix + name: float} ("val.top1" -> "val/top1")."""
    return {
        prefix + name.replace(".", "/"): float(value)
        for name, value in data.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class EventWriter:
    """TensorBoard's event files (tensorboardX's writer) or VisualDL's records in
    ``folder``: both writers take the same calls. Each start writes a file of its own
    (named by the second, the process and a count, so that two starts never share one),
    but for a resumed VisualDL run, which appends to the newest file: VisualDL shows a
    folder's newest file only."""

    def __init__(self, name, folder, resume, purge_step):
        suffix = f".{os.getpid()}.{next(_WRITERS):04d}"
        if name == "tensorboard":
            module = require("tensorboardX", "--tracker tensorboard")
            self.writer = module.SummaryWriter(
                logdir=folder,
                flush_secs=FLUSH_SECONDS,
                filename_suffix=suffix,
                purge_step=purge_step,
            )
        else:
            module = require("visualdl", "--tracker visualdl")
            newest = sorted(_visualdl_files(folder))[-1:] if resume else []
            with contextlib.redirect_stdout(io.StringIO()):  # its "will add logs to it"
                self.writer = module.LogWriter(
                    logdir=folder,
                    flush_secs=FLUSH_SECONDS,
                    filename_suffix=suffix,
                    file_name=newest[0] if newest else "",
                )

    def scalars(self, values, step):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def image(self, tag, picture, step):
        self.writer.add_image(tag, picture, step, dataformats="HWC")

    def text(self, tag, text, step):
        self.writer.add_text(tag, text, step)

    def parameters(self, flat):
        rows = "\n".join(f"| {name} | {value} |" for name, value in flat.items())
        self.text("parameters", f"| key | value |\n|---|---|\n{rows}", 0)

    def checkpoint(self, directory, step):
        self.text("checkpoints", directory, step)

    def close(self, status):
        self.writer.close()


def _visualdl_files(folder):
    """The VisualDL record files in ``folder`` (none where it does not exist)."""
    return (
        [name for name in os.listdir(folder) if "vdlrecords" in name]
        if os.path.isdir(folder)
        else []
    )


def _sql_errors():
    """SQLAlchemy's errors, which MLflow's database stores raise as they are (a file that
    is no SQLite database: "file is not a database"), once a store has imported it (the
    ``except`` asks after the error: a store that raised one has)."""
    sql = sys.modules.get("sqlalchemy.exc")
    return (sql.SQLAlchemyError,) if sql else ()


class MlflowRun:
    """One MLflow run at ``tracking_uri``: a new one, or with ``resume`` the run recorded
    in ``output_dir`` (when recorded at the same tracking URI)."""

    def __init__(self, tracking_uri, output_dir, resume, run_name):
        mlflow = require("mlflow", "--tracker mlflow")
        if not bootstrap.verbose():  # its database's set-up lines, as Paddle's are hidden
            logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.entities = mlflow.entities
        self.record = os.path.join(output_dir, MLFLOW_RUN_FILE)
        self._logged_parameters = None
        self._pending, self._flushed = [], time.monotonic()  # metrics not yet written
        try:
            self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            recorded = self._recorded(tracking_uri) if resume else None
            if recorded:
                self.run_id = recorded["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self._logged_parameters = self.client.get_run(self.run_id).data.params
            else:
                self.run_id = self._new_run(tracking_uri, output_dir, run_name)
        except (mlflow.exceptions.MlflowException, ImportError, OSError, *_sql_errors()) as err:
            raise UserError(f"--tracker mlflow at {tracking_uri}: {_first_line(err)}") from None

    def _recorded(self, tracking_uri):
        try:
            with open(self.record) as handle:
                recorded = json.load(handle)
        except (OSError, ValueError):
            return None
        return recorded if recorded.get("tracking_uri") == tracking_uri else None

    def _new_run(self, tracking_uri, output_dir, run_name):
        client = self.client
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", MLFLOW_EXPERIMENT)
        experiment = client.get_experiment_by_name(experiment_name)
        if experiment is None:
            # a local store keeps its files beside it, in the output folder
            local = tracking_uri.startswith("sqlite:///") and not os.environ.get(
                "MLFLOW_TRACKING_URI"
            )
            location = os.path.join(os.path.abspath(output_dir), "mlartifacts") if local else None
            experiment_id = client.create_experiment(experiment_name, artifact_location=location)
        else:
            experiment_id = experiment.experiment_id
        run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
        with atomic_files(self.record) as (handle,):
            handle.write(
                json.dumps(
                    {"tracking_uri": tracking_uri, "experiment_id": experiment_id, "run_id": run_id}
                ).encode()
            )
        return run_id

    def scalars(self, values, step):
        """Written in one batch at most every FLUSH_SECONDS (and before anything else):
        MLflow's store spends about as long on a batch of 60 metrics as on one of 12
        (46 and 36 ms here, SQLite)."""
        now = int(time.time() * 1000)
        self._pending += [
            self.entities.Metric(_UNSAFE_NAME.sub("_", tag), value, now, step)
            for tag, value in values.items()
        ]
        if time.monotonic() - self._flushed >= FLUSH_SECONDS:
            self._flush()

    def _flush(self):
        if self._pending:
            self.client.log_batch(self.run_id, metrics=self._pending)
        self._pending, self._flushed = [], time.monotonic()

    def image(self, tag, picture, step):
        self._flush()
        self.client.log_image(self.run_id, picture, key=tag, step=step)

    def parameters(self, flat):
        """The first start's values as parameters (MLflow refuses to change one); on a
        resume, new keys as parameters and changed values as ``resume.<key>`` tags."""
        self._flush()
        logged = self._logged_parameters or {}
        params = [self.entities.Param(k, v) for k, v in flat.items() if k not in logged]
        tags = [
            self.entities.RunTag(f"resume.{k}", v)
            for k, v in flat.items()
            if k in logged and logged[k] != v
        ]
        self.client.log_batch(self.run_id, params=params, tags=tags)

    def checkpoint(self, directory, step):
        self._flush()
        name = _UNSAFE_NAME.sub("_", os.path.basename(directory))
        tags = [
            self.entities.RunTag("checkpoint", directory),
            self.entities.RunTag(f"checkpoint.{name}", directory),
        ]
        self.client.log_batch(self.run_id, tags=tags)

    def close(self, status):
        self._flush()
        self.client.set_terminated(self.run_id, status=status)


class Trackers:
    """The trackers of one run (``opened``), fed the report's records (``record``) and
    checkpoints (``saved``); the writing runs on one background thread, in order."""

    def __init__(self, trackers, step=0):
        self.trackers = dict(trackers)  # name -> EventWriter or MlflowRun
        self.steps_per_epoch = None
        self.step = step  # the global step of the last logged training step, or the start's
        self.warnings = queue.SimpleQueue()  # lines for the report to print
        self._tasks = queue.SimpleQueue()  # functions, None to end
        self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
        self._thread.start()

    def record(self, kind, step, data):
        """What the report record (``kind``, ``step``, ``data``) is to the trackers."""
        if kind == "LOG":
            epoch, within = step
            self.steps_per_epoch = int(data["progress"].split("/")[1])
            self.step = (epoch - 1) * self.steps_per_epoch + within
            self._each("scalars", _numbers(data, "train/"), self.step)
        elif kind == "VAL":
            self._each("scalars", _numbers(data, ""), self._epoch_end(step[0]))
        elif kind == "CLASSES":
            self._classes(data, step[0])
        elif kind == "PARAMETER" and step == "PARAMETER":
            self._each("parameters", flattened(data))

    def saved(self, directory):
        self._each("checkpoint", os.path.abspath(directory), self.step)

    def _epoch_end(self, epoch):
        """The global step of ``epoch``'s last step; before any training step (an
        evaluation), the step the weights were saved at."""
        return epoch * self.steps_per_epoch if self.steps_per_epoch else self.step

    def _classes(self, result, epoch):
        step = self._epoch_end(epoch)
        accuracy = {
            f"val_class/{name}": float(value)
            for name, value in zip(result["classes"], result["accuracy"])
            if value is not None
        }
        self._each("scalars", accuracy, step)
        self._tasks.put(lambda: self._confusion(result, epoch, step))

    def _confusion(self, result, epoch, step):
        """The confusion image, drawn on the writing thread (no work of the steps')."""
        try:
            picture = confusion_picture(result, epoch)
        except Exception as err:  # matplotlib's: the image is missed, the run goes on
            self.warnings.put(f"warning: the trackers' confusion image: {_first_line(err)}")
            return
        self._call("image", CONFUSION_TAG, picture, step)

    def _each(self, method, *args):
        """Every tracker's ``method(*args)``, queued for the writing thread."""
        self._tasks.put(lambda: self._call(method, *args))

    def _call(self, method, *args):
        for name, tracker in list(self.trackers.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as err:  # a tracker's disk, server or library: the run goes on
                self.warnings.put(f"warning: --tracker {name} failed and stops: {_first_line(err)}")
                self.trackers.pop(name)

    def _work(self):
        for task in iter(self._tasks.get, None):
            task()

    def wait(self):
        """Return once everything queued so far is written (a benchmark's slices end so,
        their writing not left to the next slice)."""
        written = threading.Event()
        self._tasks.put(written.set)
        written.wait()

    def close(self, status="FINISHED"):
        """Everything queued written, then each tracker closed (MLflow's run ended with
        ``status``: FINISHED, KILLED or FAILED)."""
        self._tasks.put(None)
        self._thread.join()
        self._call("close", status)


def _first_line(err):
    text = str(err).strip()
    return text.splitlines()[0] if text else repr(err)


def opened(names, output_dir, tensorboard_dir, mlflow_uri, visualdl_dir, saved_step, trains):
    """The Trackers of ``names`` and VisualDL's where ``visualdl_dir`` is given (each
    opened now, so that a bad URI or folder stops the run before its first step), or None
    without any. TensorBoard's folder defaults to ``<output_dir>/tensorboard``,
    VisualDL's to ``<output_dir>/visualdl``, MLflow's store to ``mlflow_tracking_uri``.
    ``saved_step``: the global step of the checkpoint the run starts from (None: a fresh
    start), which continues the trackers' runs; ``trains``: the run trains from there,
    and TensorBoard's readers drop what an earlier start wrote past that step (a start
    killed after its last checkpoint; a fresh start: everything), where an evaluation
    keeps it."""
    names = tuple(names) + (("visualdl",) if visualdl_dir else ())
    if not names:
        return None
    folders = {
        "tensorboard": tensorboard_dir or os.path.join(output_dir, "tensorboard"),
        "visualdl": visualdl_dir or os.path.join(output_dir, "visualdl"),
    }
    resume = saved_step is not None
    purge_step = ((saved_step + 1) if resume else 0) if trains else None
    trackers = {}
    try:
        for name in dict.fromkeys(names):
            if name == "mlflow":
                uri = mlflow_tracking_uri(mlflow_uri, output_dir)
                run_name = os.path.basename(os.path.abspath(output_dir))
                trackers[name] = MlflowRun(uri, output_dir, resume, run_name)
            else:
                trackers[name] = EventWriter(name, folders[name], resume, purge_step)
    except UserError:  # the run stops before its first step: no tracker left running
        for tracker in trackers.values():
            tracker.close("FAILED")
        raise
    return Trackers(trackers, saved_step or 0)
