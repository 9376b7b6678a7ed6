"""MLflow, one tracker of ``core/trackers``: a run at a tracking URI (a server, a database;
by default a local SQLite store in the output folder), new or resumed
(``mlflow_resume``), its metrics written in batches."""

import logging
import os
import re
import sys
import time

from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import UserError, first_line
from paddle_resnet.core.optional import require
from paddle_resnet.core.trackers import mlflow_resume
from paddle_resnet.core.trackers.tensorboard import FLUSH_SECONDS

MLFLOW_EXPERIMENT = "paddle-resnet"
# characters MLflow refuses in a metric or tag name (a class folder may hold any)
_UNSAFE_NAME = re.compile(r"[^\w\-. /:]")


def mlflow_tracking_uri(given, output_dir):
    """Where MLflow writes: ``given``, else MLFLOW_TRACKING_URI, else a SQLite store in the
    output folder (MLflow 3 refuses its old folder store unless MLFLOW_ALLOW_FILE_STORE)."""
    return (
        given
        or os.environ.get("MLFLOW_TRACKING_URI")
        or "sqlite:///" + os.path.join(os.path.abspath(output_dir), "mlflow.db")
    )


def _sql_errors():
    """SQLAlchemy's errors, which MLflow's database stores raise as they are ("file is not a
    database"), once a store has imported it (as one that raised them has)."""
    sql = sys.modules.get("sqlalchemy.exc")
    return (sql.SQLAlchemyError,) if sql else ()


class MlflowRun:
    """One MLflow run at ``tracking_uri``: new, or with ``resume`` the one recorded there."""

    def __init__(self, tracking_uri, output_dir, resume, run_name):
        mlflow = require("mlflow", "--tracker mlflow")
        if not bootstrap.verbose():  # its database's set-up lines, as Paddle's are hidden
            logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.entities = mlflow.entities
        self._logged_parameters = None
        self._pending, self._flushed = [], time.monotonic()  # metrics not yet written
        try:
            self.client = mlflow.MlflowClient(tracking_uri=tracking_uri)
            recorded = mlflow_resume.recorded(output_dir, tracking_uri) if resume else None
            if recorded:
                self.run_id = recorded["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self._logged_parameters = self.client.get_run(self.run_id).data.params
            else:
                self.run_id = self._new_run(tracking_uri, output_dir, run_name)
        except (mlflow.exceptions.MlflowException, ImportError, OSError, *_sql_errors()) as err:
            raise UserError(f"--tracker mlflow at {tracking_uri}: {first_line(err)}") from None

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
        mlflow_resume.record(output_dir, tracking_uri, experiment_id, run_id)
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
        params, tags = mlflow_resume.parameters_and_tags(flat, self._logged_parameters or {})
        self.client.log_batch(
            self.run_id,
            params=[self.entities.Param(k, v) for k, v in params.items()],
            tags=[self.entities.RunTag(k, v) for k, v in tags.items()],
        )

    def checkpoint(self, directory, step):
        self._flush()
        name = _UNSAFE_NAME.sub("_", os.path.basename(directory))
        tags = [
            self.entities.RunTag(key, directory) for key in ("checkpoint", f"checkpoint.{name}")
        ]
        self.client.log_batch(self.run_id, tags=tags)

    def close(self, status):
        self._flush()
        self.client.set_terminated(self.run_id, status=status)
