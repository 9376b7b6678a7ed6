"""The trackers' writing thread: the run's Report (core/report.py) hands every record it
writes to ``Trackers``, which turns them into what each tracker shows: training steps as
``train/<name>`` scalars at the run's global step; validations as ``val/<name>``, each
class's accuracy as ``val_class/<class>`` and the image ``confusion_matrix``, at the step
of the validated epoch's end; the configuration as ``section.key`` parameters; each
checkpoint saved as MLflow tags ``checkpoint`` and ``checkpoint.<name>`` (a text entry
``checkpoints`` for TensorBoard and VisualDL). Written on one background thread in order,
so that a step never waits on a tracker's disk or server; a tracker that fails is dropped
with one warning line.
"""

import json
import os
import queue
import threading

from paddle_resnet.core.errors import first_line
from paddle_resnet.core.plots import confusion_picture

CONFUSION_TAG = "confusion_matrix"


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


class Trackers:
    """A run's trackers, fed the report's records and checkpoints on one writing thread."""

    def __init__(self, trackers, step=0):
        self.trackers = dict(trackers)  # name -> EventWriter or MlflowRun
        self.steps_per_epoch = None
        self.step = step  # the global step of the last logged training step, or the start's
        self.warnings = queue.SimpleQueue()  # lines for the report to print
        self._tasks = queue.SimpleQueue()  # functions, None to end
        self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
        self._thread.start()

    def record(self, kind, step, data):
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
            self.warnings.put(f"warning: the trackers' confusion image: {first_line(err)}")
            return
        self._call("image", CONFUSION_TAG, picture, step)

    def _each(self, method, *args):
        self._tasks.put(lambda: self._call(method, *args))

    def _call(self, method, *args):
        for name, tracker in list(self.trackers.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as err:  # a tracker's disk, server or library: the run goes on
                self.warnings.put(f"warning: --tracker {name} failed and stops: {first_line(err)}")
                self.trackers.pop(name)

    def _work(self):
        for task in iter(self._tasks.get, None):
            task()

    def wait(self):
        """Return once everything queued so far is written (a benchmark's slice ends so)."""
        written = threading.Event()
        self._tasks.put(written.set)
        written.wait()

    def close(self, status="FINISHED"):
        """Write everything queued, then close each tracker (MLflow's run ends with ``status``)."""
        self._tasks.put(None)
        self._thread.join()
        self._call("close", status)
