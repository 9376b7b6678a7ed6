"""The process environment Paddle reads once, when it is first imported.

``paddle_resnet/__init__.py`` calls ``prepare_environment`` so that it runs before
any module of the package imports Paddle. Values the user set are kept.
"""
import os


def available_cores():
    return len(os.sched_getaffinity(0))


def prepare_environment(environ=os.environ):
    # Fleet's static meta-optimizers (AMP, ASP, QAT) need the legacy static IR;
    # Paddle 3.x builds PIR programs unless told otherwise (2.6 ignores the flag).
    environ.setdefault("FLAGS_enable_pir_api", "0")
    # Paddle's static executor uses one math thread unless told otherwise.
    environ.setdefault("OMP_NUM_THREADS", str(available_cores()))
