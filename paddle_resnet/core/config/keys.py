"""What declares a config key: the choices and tools a key names, the checks of one value,
and ``key``, which makes a key a dataclass field with its flag, help, check and tools
(the sections are the other modules of this package)."""

import os
from dataclasses import field

# configs/ of the repository: paddle_resnet/core/config/keys.py is four levels below it
REPOSITORY = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
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
ALL_TOOLS = TOOLS
# the tools that read image trees (every tool but the server, which is sent its images)
IMAGE_TOOLS = ("train", "export_model", "inference", "check_data")


# ---------------------------------------------------------------- checks of one value
# Each returns None when the value is fine, else what is wrong ("must be ..., got ...").


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
    ``tools`` that read it (each a name in TOOLS).
    ``deprecated`` aliases still work but print a warning naming ``flag``.
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
