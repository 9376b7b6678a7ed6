"""What declares a config key: the choices and tools a key names, the checks of one value,
and ``key``, which makes a key a dataclass field with its flag, help, check and tools
(the sections are the other modules of this package)."""

import os
from dataclasses import field

from paddle_resnet.core.bootstrap import REPOSITORY

CONFIG_DIR = os.path.join(REPOSITORY, "configs")
RUN_SCOPES = ("train_eval", "train_only", "eval_only")
IRS = ("legacy", "pir")
LR_SCHEDULES = ("cosine", "step")
# The sparsity mask algorithms, by the names of their functions in
# training/sparsity/pattern.py (declared here, where the config checks --mask-algo).
MASK_ALGOS = ("mask_1d", "mask_2d_greedy", "mask_2d_best")
DATA_LAYOUTS = ("NCHW", "NHWC")
# serve: the export over the Open Inference Protocol (paddle-resnet-serve, deploy/serve.py)
INFERENCE_MODES = ("accuracy", "benchmark", "predict", "serve")
TRT_PRECISIONS = ("FP32", "FP16", "INT8")
CPU_PRECISIONS = ("fp32", "bf16", "int8")
PTQ_ALGOS = ("KL", "hist", "mse", "avg", "abs_max")
AMP_DTYPES = ("float16", "bfloat16")
# --sampling: how a training epoch draws the images of an image tree (data/dali.py)
SAMPLINGS = ("shuffle", "class-balanced")
DEFAULT_INFERENCE_DIR = "./inference"

# The tools that read a key, declared on the key (``key(..., tools=...)``): each tool's
# command line takes exactly the flags of the keys it reads and refuses the others.
TOOLS = ("train", "export_model", "inference", "check_data", "serve")
TRAIN = ("train",)
EXPORT = ("export_model",)
INFERENCE = ("inference",)
CHECK_DATA = ("check_data",)
TRAIN_EXPORT = ("train", "export_model")
TRAIN_INFERENCE = ("train", "inference")
EXPORT_INFERENCE = ("export_model", "inference")
SERVE = ("serve",)
MODEL_TOOLS = ("train", "export_model", "inference")
# the tools that read image trees (every tool but the server, which is sent its images)
IMAGE_TOOLS = ("train", "export_model", "inference", "check_data")


# The checks of one value: None if it is fine, else what is wrong ("must be ..., got ...").


def at_least(low):
    return lambda v: None if v >= low else f"must be at least {low}, got {v}"


def positive(v):
    return None if v > 0 else f"must be positive, got {v}"


def in_range(low, high, text):
    """``low <= v < high``, described by ``text`` such as "[0, 1)"."""
    return lambda v: None if low <= v < high else f"must be in {text}, got {v}"


def each(check):
    return lambda values: next((problem for problem in map(check, values) if problem), None)


def nonempty(values):
    return None if values else "needs at least one value"


def _not_a_folder(path):
    """Where the way to folder ``path`` meets something that is not a folder (``path``
    itself, or a file above it), or None: a folder, or one that can be made."""
    on_the_way = os.path.abspath(path)
    while not os.path.lexists(on_the_way):
        on_the_way = os.path.dirname(on_the_way)
    return None if os.path.isdir(on_the_way) else on_the_way


def folder(path):
    """A folder the run makes or writes into: nothing on its way is a file (checked before
    the run writes anything: a tracker told a file wrote nothing and said nothing)."""
    blocked = _not_a_folder(path)
    if blocked is None:
        return None
    on_its_way = "" if blocked == os.path.abspath(path) else " (on its way)"
    return f"must name a folder, but {blocked} is not one{on_its_way}"


def sqlite_file(uri):
    """An MLflow tracking URI: a SQLite one (sqlite:///PATH) names a database file in a
    folder (MLflow retried a folder for minutes, then failed in a traceback)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].partition("?")[0]
    if os.path.isdir(path):
        return f"must name a database file, but {path} is a folder"
    blocked = _not_a_folder(os.path.dirname(os.path.abspath(path)))
    if blocked is None:
        return None
    return f"must name a database file in a folder, but {blocked} is not a folder"


def both(*checks):
    return lambda v: next((problem for problem in (c(v) for c in checks) if problem), None)


def key(
    default,
    flag,
    help,
    check=None,
    choices=None,
    aliases=(),
    deprecated=(),
    resume_may_change=False,
    tools=TRAIN,
    repeatable=False,
):
    """A config field: its default, flag, help text, check and alias flags, and the
    ``tools`` that read it; ``deprecated`` aliases still work but print a warning.
    ``resume_may_change``: a resumed run may set another value than the checkpoint's
    run (where files go, how often to log); every other key must match.
    ``repeatable``: a tuple whose flag may be given again, adding its values."""
    return field(
        default=default,
        metadata={
            "flag": flag,
            "help": help,
            "check": check,
            "choices": choices,
            "aliases": tuple(aliases),
            "deprecated": tuple(deprecated),
            "resume_may_change": resume_may_change,
            "tools": tools,
            "repeatable": repeatable,
        },
    )
