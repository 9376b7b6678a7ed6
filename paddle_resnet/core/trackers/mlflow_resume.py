"""MLflow's resume: the run id kept in ``<output-dir>/mlflow_run.json``, so that a resumed
start continues that run (where recorded at the same tracking URI), and what a resumed
start logs of the configuration: new keys as parameters, changed values as
``resume.<key>`` tags (MLflow refuses to change a parameter)."""

import json
import os

from paddle_resnet.core.atomic import atomic_files

MLFLOW_RUN_FILE = "mlflow_run.json"


def recorded(output_dir, tracking_uri):
    """The run recorded in ``output_dir`` at ``tracking_uri``, or None."""
    try:
        with open(os.path.join(output_dir, MLFLOW_RUN_FILE)) as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if found.get("tracking_uri") == tracking_uri else None


def record(output_dir, tracking_uri, experiment_id, run_id):
    """Keep the new run's id for the starts that resume it."""
    found = {"tracking_uri": tracking_uri, "experiment_id": experiment_id, "run_id": run_id}
    with atomic_files(os.path.join(output_dir, MLFLOW_RUN_FILE)) as (handle,):
        handle.write(json.dumps(found).encode())


def parameters_and_tags(flat, logged):
    """({key: value} to log as parameters, {tag: value} to set) of the configuration
    ``flat`` where the run already holds the parameters ``logged`` (a fresh run: none)."""
    params = {k: v for k, v in flat.items() if k not in logged}
    tags = {f"resume.{k}": v for k, v in flat.items() if k in logged and logged[k] != v}
    return params, tags
