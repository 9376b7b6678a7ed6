"""The IR seam: which of Paddle's two static graphs a run builds on, and the few
questions about a built program whose answer differs between them.

- legacy: Paddle's ProgramDesc IR, the one NVIDIA's workflow stands on (Fleet's
  DistributedStrategy for AMP, ASP, QAT and data parallelism); the only one on 2.6.
- pir: Paddle 3.x's new IR. Paddle has no PIR implementation of ASP, static QAT or the
  Fleet meta-optimizers: on PIR the toolkit applies its own 2:4 masks
  (``pir_strategies.py``, ``sparsity/masks.py``) and quantizes the model with
  ``paddle.quantization`` before building (``programs._forward``).

Which IR a run is on (``chosen``): ``--ir`` as given; unset, PIR on Paddle 3 wherever it
loses nothing, measured (benchmarks/ir_parity_*.json, docs/guide.md "PIR first"):
multi-process CPU jobs stay on the legacy IR's tested gradient exchange, and GPUs on
NVIDIA's legacy-IR workflow (not measured). ``PADDLE_RESNET_PIR_ONLY=1``: PIR alone.

The process starts on the legacy IR (``core/bootstrap.py``); a PIR run switches for its
whole length with ``selected(config)`` (the flag, the Program classes and the dtypes
change together), so one process can build and run either.
"""

import collections
import os

import paddle

from paddle_resnet.core import bootstrap, paddle_internals
from paddle_resnet.core.devices import gpu_available
from paddle_resnet.core.errors import ConfigError

# What each IR cannot do, as one line naming the IR that can.
LEGACY_ONLY = {"amp.fuse_resunit": "--fuse-resunit", "run.sync_bn": "--sync-bn"}


def chosen(config):
    """(the IR ``config`` runs on, why, or None where that is its Paddle's default)."""
    if config.run.ir:
        return config.run.ir, None
    if not paddle_internals.PADDLE3:
        return "legacy", None
    if bootstrap.pir_only() or bf16_amp(config):  # bf16 AMP trains on PIR only
        return "pir", None
    refusal = _pir_refusal(config)
    if refusal:
        return "legacy", refusal
    if gpu_available():
        return "legacy", "PIR on GPUs is not measured yet (NVIDIA's workflow is legacy-IR)"
    # a multi-rank job: on plain kernels (``onednn.onednn_wanted``) PIR was 0.95x the
    # legacy IR at the demo's size and 0.96-1.07x at 224 px
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        return "legacy", "a multi-process CPU job stays on the legacy IR's tested gradient exchange"
    return "pir", None


def bf16_amp(config):
    return config.amp.dtype == "bfloat16" and config.amp.enabled


def is_pir(config):
    return chosen(config)[0] == "pir"


def record(config):
    name, why = chosen(config)
    return {"name": name, "why": why}


def label(config):
    return "PIR" if is_pir(config) else "legacy IR"


def legacy_note(config):
    """Why a run on Paddle 3 is on the legacy IR when it did not ask, or None."""
    name, why = chosen(config)
    if name == "legacy" and why:
        return f"on the legacy IR: {why} (--ir pir to choose PIR)"
    return None


def _pir_refusal(config):
    """Why PIR cannot run ``config`` (an option it lacks), or None."""
    for dotted, flag in LEGACY_ONLY.items():
        section, name = dotted.split(".")
        if getattr(getattr(config, section), name):
            return f"{flag} is built on the legacy IR only"
    bf16 = bf16_amp(config)
    if bf16 and config.amp.use_dynamic_loss_scaling:
        return "--use-dynamic-loss-scaling is for float16: bfloat16 has float32's range"
    # PIR checks kernel dtypes while building: on the CPU build conv2d has no float16
    # kernel, and momentum none for bfloat16 weights (O2 keeps the weights in bf16).
    if config.amp.enabled and not paddle.is_compiled_with_cuda():
        if not bf16:
            return (
                "--amp with float16 on PIR needs the GPU build of Paddle (or --amp-dtype bfloat16)"
            )
        if config.amp.use_pure_fp16:
            return (
                "--use-pure-fp16 with bfloat16 on PIR needs the GPU build of Paddle (its CPU "
                "optimizer kernels take no bfloat16 weights): drop it for O1"
            )
    return None


def _check_available(config):
    if config.run.ir == "legacy" and bootstrap.pir_only():
        raise ConfigError(
            f"--ir legacy: {bootstrap.PIR_ONLY_VARIABLE}=1 makes the legacy IR unavailable"
        )


def check(config):
    """The options the IR of ``config`` cannot run, refused in one line."""
    _check_available(config)
    if not is_pir(config):
        if bf16_amp(config):  # Fleet's AMP is fp16; the legacy bf16 rewrite cannot train
            raise ConfigError("--amp-dtype bfloat16 is built on PIR only: use --ir pir")
        return
    if not paddle_internals.PADDLE3:
        raise ConfigError(
            f"--ir pir needs Paddle 3.x (this is Paddle {paddle.__version__}): "
            "use --ir legacy, or install Paddle 3 (scripts/setup.sh with PADDLE_VERSION=3.3.1)"
        )
    refusal = _pir_refusal(config)
    if refusal and bootstrap.pir_only():
        raise ConfigError(f"{refusal}, unavailable under {bootstrap.PIR_ONLY_VARIABLE}=1")
    if refusal:
        raise ConfigError(f"{refusal}: use --ir legacy")


def selected(config):
    """The IR of ``config`` for the enclosed building and running."""
    _check_available(config)
    return paddle_internals.static_ir(is_pir(config))


def op_sequence(program):
    """The op types of ``program``'s global block in order, without PIR's dialect prefix
    (``pd_op.conv2d`` is ``conv2d``)."""
    if paddle_internals.is_pir_program(program):
        return [op.name().split(".", 1)[-1] for op in program.global_block().ops]
    return [op.type for op in program.global_block().ops]


def op_types(program):
    return collections.Counter(op_sequence(program))


def parameters(program):
    return program.global_block().all_parameters()


def persistable_names(program):
    return {v.name for v in program.list_vars() if v.persistable}


def seed(main, startup, value):
    main.random_seed = startup.random_seed = value


# The inputs and outputs of the ops ``describe.py`` measures, by the legacy slot names;
# PIR's operands and results come in this order.
_SLOTS = {
    "conv2d": (("Input", "Filter"), ("Output",)),
    "depthwise_conv2d": (("Input", "Filter"), ("Output",)),
    "matmul_v2": (("X", "Y"), ("Out",)),
    "matmul": (("X", "Y"), ("Out",)),
    "mul": (("X", "Y"), ("Out",)),
}


def op_shapes(program):
    """(op type, input shapes, output shapes) of ``program``'s convolutions and matmuls."""
    block = program.global_block()
    pir = paddle_internals.is_pir_program(program)
    for op in block.ops:
        kind = op.name().split(".", 1)[-1] if pir else op.type
        if kind not in _SLOTS:
            continue
        inputs, outputs = _SLOTS[kind]
        if pir:
            ins = [list(op.operand_source(i).shape) for i in range(len(inputs))]
            outs = [list(op.result(i).shape) for i in range(len(outputs))]
        else:
            ins = [list(block.var(op.input(slot)[0]).shape) for slot in inputs]
            outs = [list(block.var(op.output(slot)[0]).shape) for slot in outputs]
        yield kind, ins, outs


def feed_target(program, name):
    """The input variable (legacy) or value (PIR) ``name`` of ``program``."""
    if paddle_internals.is_pir_program(program):
        for op in program.global_block().ops:
            if op.name() == "pd_op.data" and op.attrs()["name"] == name:
                return op.result(0)
        raise KeyError(name)
    return program.global_block().var(name)


def fetch_target(program, fetched):
    """What ``program`` computes for ``fetched`` (a legacy clone has its own variables)."""
    if paddle_internals.is_pir_program(program):
        return fetched
    return program.global_block().var(fetched.name)


def computes_in_low_precision(program):
    """Whether values of ``program`` are float16 or bfloat16 (on PIR: AMP's casts')."""
    if paddle_internals.is_pir_program(program):
        casts = (op for op in program.global_block().ops if op.name() == "pd_op.cast")
        dtypes = (op.result(0).dtype for op in casts)
    else:
        dtypes = (v.dtype for v in program.list_vars())
    return any(str(dtype).lower().endswith(("float16", "bf16", "fp16")) for dtype in dtypes)


def masks_applied(program, suffix):
    """Whether ``program`` multiplies weights by mask variables (names ending in
    ``suffix``) after its updates: Fleet's ASP on the legacy IR, the toolkit's on PIR."""
    if paddle_internals.is_pir_program(program):
        return any(
            op.name() == "pd_op.multiply"
            and op.operand_source(1).persistable
            and op.operand_source(1).name.endswith(suffix)
            for op in program.global_block().ops
        )
    return any(
        op.type == "elementwise_mul" and op.input("Y")[0].endswith(suffix)
        for op in program.global_block().ops
    )


def loss_scaling_overflow(program):
    """The boolean AMP's dynamic loss scaling computes each step (the gradients overflowed:
    the update skipped; ``update_loss_scaling``'s ``FoundInfinite``), or None."""
    if paddle_internals.is_pir_program(program):
        for op in program.global_block().ops:
            if op.name() in ("pd_op.update_loss_scaling", "pd_op.update_loss_scaling_"):
                return op.operand_source(1)
        return None
    block = program.global_block()
    for op in block.ops:
        if op.type == "update_loss_scaling":
            return block.var(op.input("FoundInfinite")[0])
    return None
