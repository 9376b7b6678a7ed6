"""Experiment trackers beside the report (``--tracker tensorboard|mlflow|visualdl``), rank
0's: one module per tracker and the thread that writes to them (``writing``); ``opened``
opens a run's. A resumed run continues the tracker's run: TensorBoard and VisualDL write
into the same folder from the global step the run resumes (TensorBoard's readers drop
what an earlier start wrote past it: no two curves); MLflow's run id is kept in
``<output-dir>/mlflow_run.json`` and that run is resumed (``mlflow_resume``).
"""

import os

from paddle_resnet.core.errors import UserError
from paddle_resnet.core.optional import TRACKERS
from paddle_resnet.core.trackers.mlflow_resume import MLFLOW_RUN_FILE
from paddle_resnet.core.trackers.mlflow_run import MlflowRun, mlflow_tracking_uri
from paddle_resnet.core.trackers.tensorboard import TensorBoard
from paddle_resnet.core.trackers.visualdl import VisualDl
from paddle_resnet.core.trackers.writing import CONFUSION_TAG, Trackers

__all__ = ["CONFUSION_TAG", "MLFLOW_RUN_FILE", "TRACKERS", "Trackers", "mlflow_tracking_uri"]


def opened(names, output_dir, tensorboard_dir, mlflow_uri, visualdl_dir, saved_step, trains):
    """The Trackers of ``names`` (and VisualDL's where ``visualdl_dir`` is given), or None;
    each opened now, so that a bad URI or folder stops the run before its first step.
    ``saved_step``: the global step the run starts from (None: a fresh start); ``trains``:
    TensorBoard's readers drop what an earlier start wrote past it."""
    names = tuple(names) + (("visualdl",) if visualdl_dir else ())
    if not names:
        return None
    resume = saved_step is not None
    purge_step = ((saved_step + 1) if resume else 0) if trains else None
    trackers = {}
    try:
        for name in dict.fromkeys(names):
            if name == "mlflow":
                uri = mlflow_tracking_uri(mlflow_uri, output_dir)
                run_name = os.path.basename(os.path.abspath(output_dir))
                trackers[name] = MlflowRun(uri, output_dir, resume, run_name)
            elif name == "visualdl":
                trackers[name] = VisualDl(visualdl_dir or os.path.join(output_dir, name), resume)
            else:
                folder = tensorboard_dir or os.path.join(output_dir, name)
                trackers[name] = TensorBoard(folder, purge_step)
    except UserError:  # the run stops before its first step: no tracker left running
        for tracker in trackers.values():
            tracker.close("FAILED")
        raise
    return Trackers(trackers, saved_step or 0)
