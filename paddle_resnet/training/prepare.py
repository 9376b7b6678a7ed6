"""The programs of a run made ready, by one owner: built, the startup program run, the
legacy IR's rewrites that need the initialised scope (pure fp16's weights, QAT's eval
program; PIR did both while building), and once the start weights are in, 2:4 pruning.
Every tool takes this path: a run (``run.py``) and export (``inference_model``)."""

import contextlib
from dataclasses import dataclass
from typing import Any, List, Optional

import paddle

from paddle_resnet.core import feeds
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.training import ir, start_weights
from paddle_resnet.training.programs import build_programs, input_shape
from paddle_resnet.training.qat import (
    PIR_QAT_RECORD,
    QAT_RECORD,
    freeze_qat,
    int8_ops,
    quantize_eval_program,
)
from paddle_resnet.training.sparsity import masks as sparse_masks
from paddle_resnet.training.sparsity.pattern import recorded


def ready_for_weights(config, training, world_size, steps_per_epoch, place):
    """(programs, executor): the programs built for this run's global batch, their
    variables initialised and rewritten, ready for the start weights."""
    programs = build_programs(
        config, steps_per_epoch, config.data.batch_size * world_size, training=training
    )
    exe = paddle.static.Executor(place)
    exe.run(programs.startup)
    if not ir.is_pir(config):
        if training and config.amp.enabled and config.amp.use_pure_fp16:
            init_pure_fp16(programs, place)
        if config.qat.enabled:
            # Before any weights are loaded, so a QAT checkpoint's scales find their variables.
            quantize_eval_program(programs.eval, place)
    return programs, exe


def init_pure_fp16(programs, place):
    """Pure fp16's parameters cast, the eval program reading them so (NVIDIA's
    ``amp_init`` with ``use_fp16_test``)."""
    programs.optimizer.amp_init(
        place, scope=paddle.static.global_scope(), test_program=programs.eval, use_fp16_test=True
    )


def prune(session, start):
    """--asp in a training run, after the start weights (``masks.prepare``)."""
    config = session.config
    if config.asp.enabled and session.training:
        epochs_done, steps_done = start
        resumed = epochs_done > 0 or steps_done > 0
        sparse_masks.prepare(session.programs, config.asp, session.report, resumed, session.place)


@dataclass
class InferenceModel:
    """The eval program of a model's weights as inference runs it (``inference_model``)."""

    exe: Any
    program: Any  # fp32, or a legacy QAT model frozen into its deployed int8 form
    image: Any  # its input: a variable (legacy IR) or a value (PIR)
    output: Any  # its class probabilities
    classes: List[str]
    input_shape: List[int]
    pir: bool  # built on PIR (exported as inference.json)
    sparsity: Optional[dict]  # the pattern its weights hold and which (``pattern.record``)
    quantization: Optional[dict]  # how it was quantized (QAT), for model.json
    source: str  # the checkpoint or file of its weights


@contextlib.contextmanager
def inference_model(config, place):
    """The ``InferenceModel`` of the weights ``config`` names, under its IR: read as
    evaluation reads them, loaded, a legacy QAT model frozen (``qat.freeze_qat``)."""
    with ir.selected(config):
        start = start_weights.read(config, classes=None, training=False)
        if start.state is None:
            raise ConfigError("export needs --from-checkpoint or --from-pretrained-params")
        programs, exe = ready_for_weights(config, False, 1, None, place)
        start_weights.load_into(programs, start)
        pir = ir.is_pir(config)
        legacy_qat = config.qat.enabled and not pir
        program = freeze_qat(programs.eval, place) if legacy_qat else programs.eval
        quantization = None
        if config.qat.enabled:  # PIR: the model was quantized as it was built
            quantization = dict(PIR_QAT_RECORD if pir else QAT_RECORD, ops=int8_ops(program))
        yield InferenceModel(
            exe=exe,
            program=program,
            image=ir.feed_target(program, feeds.IMAGE),
            output=ir.fetch_target(program, programs.eval_fetches["probs"]),
            classes=start_weights.class_names(start),
            input_shape=input_shape(config),
            pir=pir,
            sparsity=recorded(start.meta, start.state),
            quantization=quantization,
            source=start_weights.source_of(config),
        )
