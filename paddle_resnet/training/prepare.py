"""The programs of a run made ready, by one owner: built (``programs.py``), the startup
program run, the legacy IR's rewrites that need the initialised scope (pure fp16's
weights, QAT's eval program), and once the start weights are in, 2:4 pruning (--asp).
PIR needs neither rewrite: its O2 made the weights low precision, and its QAT
quantized the model, as the programs were built."""

import paddle

from paddle_resnet.training import ir
from paddle_resnet.training.programs import build_programs
from paddle_resnet.training.qat import quantize_eval_program
from paddle_resnet.training.sparsity import masks as sparse_masks


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
    """After the startup program ran: pure fp16 casts the parameters to fp16 (the
    optimizer keeps fp32 masters) and rewrites the eval program to read them as fp16
    (NVIDIA's ``amp_init`` with ``use_fp16_test``)."""
    programs.optimizer.amp_init(
        place, scope=paddle.static.global_scope(), test_program=programs.eval, use_fp16_test=True
    )


def prune(session, start):
    """--asp in a training run, after the start weights: prune (unless the run resumes
    from ``start`` = (epochs done, steps done), its checkpoint's masks restored) or take
    the masks from 2:4 weights; the layer table."""
    config = session.config
    if config.asp.enabled and session.training:
        epochs_done, steps_done = start
        sparse_masks.prepare(
            session.programs,
            config.asp,
            session.report,
            resumed=epochs_done > 0 or steps_done > 0,
            place=session.place,
        )
