"""Every private or version-specific Paddle API the toolkit touches, each with why.

Paddle is retiring the legacy static graph this toolkit is built on (its CI stopped
testing it in 2025; the ASP and static QAT tests moved to ``test/deprecated``). When it
goes, this module is where the work lands; nothing else in the package reaches behind
Paddle's public API. (The switch to the legacy IR itself, ``FLAGS_enable_pir_api=0``,
is an environment variable: ``bootstrap.py`` sets it before Paddle loads.)
"""

import contextlib
import functools
import gc
import hashlib

import paddle
from paddle import _C_ops
from paddle.base import core
from paddle.base.data_feeder import convert_dtype
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.common import CollectiveHelper
from paddle.incubate import asp
from paddle.quantization import QuantConfig
from paddle.quantization.quanters import FakeQuanterWithAbsMaxObserver
from paddle.quantization.quanters.abs_max import FakeQuanterWithAbsMaxObserverLayer
from paddle.static.amp.decorator import OptimizerWithMixedPrecision
from paddle.static.quantization import quanter

from paddle_resnet.core import bootstrap
from paddle_resnet.core.errors import UserError

PADDLE3 = int(paddle.__version__.split(".")[0]) >= 3
# The defaults of Paddle's static QAT pass, which Fleet's QAT meta-optimizer starts from
# (private in paddle.static.quantization.quanter; no public equivalent).
QUANT_CONFIG_DEFAULT = quanter._quant_config_default
NVTX_FUNCTIONS = ("nvprof_nvtx_push", "nvprof_nvtx_pop", "nvprof_start", "nvprof_stop")


def supports_bf16():
    """Whether this CPU runs Paddle's bf16 kernels (core: no public equivalent)."""
    return core.supports_bfloat16()


def batch_norm_state(bn):
    """A ``nn.BatchNorm2D``'s (epsilon, momentum) and (scale, shift, running mean,
    running variance), as its own forward hands them to the kernel (private attributes:
    the layer has no public accessors)."""
    return (float(bn._epsilon), float(bn._momentum)), (bn.weight, bn.bias, bn._mean, bn._variance)


def set_math_threads(count):
    """The CPU math libraries' threads (MKL, OpenMP): Paddle's ``platform::SetNumThreads``, as
    its predictors call it (core: no public equivalent)."""
    core.set_num_threads(count)


def is_bfloat16(tensor):
    """Whether a scope's tensor holds bfloat16, which NumPy sees as its uint16 bits (the
    tensor's ``_dtype``: no public equivalent on a scope's tensor)."""
    try:
        return "bfloat16" in str(tensor._dtype()).lower()
    except (AttributeError, RuntimeError, TypeError):
        return False


def nccl_version():
    """NCCL's version as Paddle's build reports it (an int such as 21602), or None."""
    return core.nccl_version() if core.is_compiled_with_nccl() else None


def nvtx_functions():
    """(push, pop, capture start, capture stop) of the GPU build, or None on the CPU build."""
    functions = [getattr(core, name, None) for name in NVTX_FUNCTIONS]
    return None if None in functions else functions


def current_place():
    """The place Paddle runs ops on by default (what Executor(None) would use). Under
    PIR Paddle's own answer is an undefined generic place, which DenseTensor.set refuses:
    the device Paddle is set to is asked instead."""
    place = paddle.framework._current_expected_place()
    if isinstance(place, (core.CPUPlace, core.CUDAPlace)):
        return place
    device = paddle.device.get_device()  # "cpu" or "gpu:N"
    if device.startswith("gpu"):
        return paddle.CUDAPlace(int(device.split(":")[1]))
    return paddle.CPUPlace()


def numpy_dtype(variable_dtype):
    return convert_dtype(variable_dtype)


@contextlib.contextmanager
def static_ir(pir):
    """Build and run on PIR (``pir``) or on the legacy IR inside, and restore the IR the
    process was on (Paddle 3.x; 2.6 has the legacy IR only). Paddle's own guards
    (``paddle.pir_utils.IrGuard``, not in its documented API) decide from the
    ``FLAGS_enable_pir_api`` flag, which was seen to say PIR in a process on the legacy
    IR, and then switch nothing; here the switch is always made, and the state, not the
    flag, restored."""
    if not pir and bootstrap.pir_only():
        raise UserError(
            f"this needs Paddle's legacy IR, which {bootstrap.PIR_ONLY_VARIABLE}=1 makes "
            "unavailable (the rehearsal of a Paddle without it)"
        )
    if not PADDLE3:
        yield
        return
    was_pir = paddle.base.framework.global_var._use_pir_api_
    flag = paddle.get_flags("FLAGS_enable_pir_api")["FLAGS_enable_pir_api"]
    _switch_ir(pir)
    try:
        yield
    finally:
        _switch_ir(was_pir)
        paddle.set_flags({"FLAGS_enable_pir_api": flag})


def _switch_ir(pir):
    paddle.set_flags({"FLAGS_enable_pir_api": pir})
    (paddle.pir_utils._switch_to_pir_ if pir else paddle.pir_utils._switch_to_old_ir_)()


def is_pir_program(program):
    return PADDLE3 and isinstance(program, paddle.pir.Program)


def pir_qat_config(moving_rate=0.9, bits=8):
    """``paddle.quantization``'s QuantConfig for QAT on PIR: moving-average abs-max fake
    quantization of activations and weights, with the evaluation path repaired. Paddle
    3.3.1's own quanter builds an eval-mode PIR program that fails at run time ("Tensor
    not initialized yet": its kernel leaves OutScale unset in test mode, then the layer
    copies it into the scale); in eval mode this one quantizes with the trained scale and
    copies nothing."""
    factory = _EvalSafeAbsMaxQuanter(moving_rate=moving_rate, bit_length=bits)
    return QuantConfig(activation=factory, weight=factory)


class _EvalSafeAbsMaxQuanterLayer(FakeQuanterWithAbsMaxObserverLayer):
    def pir_forward(self, input):
        if self.training:
            return super().pir_forward(input)
        out, _, _, _ = _C_ops.fake_quantize_dequantize_moving_average_abs_max(
            input, self._scale, None, None, self._moving_rate, self._bit_length, True, 1
        )
        return out


class _EvalSafeAbsMaxQuanter(FakeQuanterWithAbsMaxObserver):
    def _get_class(self):
        return _EvalSafeAbsMaxQuanterLayer


# PIR has no per-op ``use_mkldnn`` attribute, and its global FLAGS_use_onednn puts every op
# with a oneDNN kernel on oneDNN (its max-pool gradient then fails: "workspace mismatch
# between forward and backward primitive descriptors"; pd_op_to_kernel_pass.cc has no
# exclusion list). Chosen ops are moved to the oneDNN dialect by rewrite patterns (DRR,
# ``paddle.pir.DrrPatternContext``: not documented), with the attributes 3.3.1's oneDNN
# op definitions require.
_CONV_ATTRS = ("strides", "paddings", "padding_algorithm", "dilations", "groups", "data_format")


def _onednn_rewrite(ctx, op, inputs, outputs, kept=(), added=None, input_dtype=None):
    """A DRR pattern moving ``pd_op.<op>`` (tensors named ``inputs``, ``outputs``) to
    ``onednn_op.<op>``: its attributes ``kept``, and those ``added`` ({name: bool or str});
    with ``input_dtype`` (float32, bfloat16, ...), only where its first input has it."""
    source = ctx.SourcePattern()
    attrs = {a: source.Attr(a) for a in kept}
    source.Op(f"pd_op.{op}", attrs)(
        [source.Tensor(n) for n in inputs], [source.Tensor(n) for n in outputs]
    )
    if input_dtype:
        source.AddConstraint(
            lambda match: str(match.Tensor(inputs[0]).dtype).rsplit(".", 1)[-1] == input_dtype
        )
    result = source.ResultPattern()
    for name, value in (added or {}).items():
        attrs[name] = (result.BoolAttr if isinstance(value, bool) else result.StrAttr)(value)
    result.Op(f"onednn_op.{op}", attrs)(
        [result.Tensor(n) for n in inputs], [result.Tensor(n) for n in outputs]
    )


def _onednn_conv2d(ctx, dtype):
    """pd_op.conv2d on inputs of ``dtype`` (float32, bfloat16) to the oneDNN dialect. The
    kernel takes the primitive's data type from ``onednn_data_type``, not from its inputs:
    bf16 inputs under the default ("") ran an fp32 convolution (oneDNN's verbose log:
    ``brg_conv_fwd:avx512_core ... src:f32``) behind a bf16-to-fp32 reorder, where
    "bfloat16" runs AMX's (``brg_conv_fwd:avx10_1_512_amx ... src:bf16``)."""
    added = dict(is_test=False, force_fp32_output=False, mkldnn_data_type=dtype)
    added["onednn_data_type"] = "bfloat16" if dtype == "bfloat16" else ""
    _onednn_rewrite(ctx, "conv2d", ("input", "filter"), ("out",), _CONV_ATTRS, added, dtype)


def _onednn_conv2d_grad(ctx):
    inputs, outputs = ("input", "filter", "out_grad"), ("input_grad", "filter_grad")
    _onednn_rewrite(ctx, "conv2d_grad", inputs, outputs, _CONV_ATTRS, {"is_test": False})


def _onednn_relu(ctx):
    added = {"mkldnn_data_type": "float32", "onednn_data_type": ""}
    _onednn_rewrite(ctx, "relu", ("x",), ("out",), added=added)


def _onednn_relu_grad(ctx):
    _onednn_rewrite(ctx, "relu_grad", ("out", "out_grad"), ("x_grad",))


_ONEDNN_PATTERNS = {
    "conv2d": (
        functools.partial(_onednn_conv2d, dtype="float32"),
        functools.partial(_onednn_conv2d, dtype="bfloat16"),
    ),
    "conv2d_grad": (_onednn_conv2d_grad,),
    "relu": (_onednn_relu,),
    "relu_grad": (_onednn_relu_grad,),
}


def _register_onednn_dialect():
    """PIR registers the oneDNN dialect when its executor first lowers a program; a
    rewrite before that builds nameless ops (the program then fails to lower: "kernel
    output args (0) defs should equal op outputs (1)"). A throwaway program is lowered."""
    program = paddle.static.Program()
    with paddle.static.program_guard(program, paddle.static.Program()):
        out = paddle.full([1], 1.0, "float32")
    with private_scope():
        paddle.static.Executor(paddle.CPUPlace()).run(program, fetch_list=[out])


def onednn_ops_on_pir(program, op_types):
    """Move the ops of ``op_types`` of a PIR ``program`` to oneDNN kernels; how many moved.
    RuntimeError if one is left (a Paddle whose oneDNN ops take other attributes)."""
    _register_onednn_dialect()
    passes = paddle.pir.PassManager()
    for op_type in op_types:
        for index, pattern in enumerate(_ONEDNN_PATTERNS[op_type]):
            ctx = paddle.pir.DrrPatternContext()
            pattern(ctx)
            passes.register_pass(f"paddle_resnet_onednn_{op_type}_{index}", ctx)
    passes.run(program)
    names = [op.name() for op in program.global_block().ops]
    left = [n for n in names if not n or n in {f"pd_op.{t}" for t in op_types}]
    if left:
        raise RuntimeError(f"oneDNN rewrite left {len(left)} ops ({left[0]!r})")
    return sum(n.startswith("onednn_op.") for n in names)


@contextlib.contextmanager
def private_scope():
    """A scope of its own (loading an export beside training's global scope), freed on
    leaving. Paddle keeps every scope made from Python in a pool until the process ends:
    each export read kept its weights (45 MB for ResNet-18; 4 GB in one test that read an
    export 100 times). The executors that ran in it must be gone by the end of the block."""
    scope = paddle.static.Scope()
    try:
        with paddle.static.scope_guard(scope):
            yield scope
    finally:
        gc.collect()  # executors whose caches hold reference cycles, before the scope goes
        scope._remove_from_pool()


def set_op_attr(op, name, value):
    """Set an attribute of a built op (e.g. ``use_mkldnn``): Paddle has no public setter."""
    op._set_attr(name, value)


def remove_ops(program, op_types):
    for block in program.blocks:  # sub-blocks too (gradient merge)
        for index in reversed(range(len(block.ops))):
            if block.ops[index].type in op_types:
                block._remove_op(index)


def rename_vars(block, renames):
    """Each ``old: new`` of ``renames``, in order. ``Block._rename_var`` syncs the whole block
    with its C++ desc after each rename (Python loops over every variable and op: 689
    renames took 10 s of a ResNet-50 QAT+AMP build); a rename changes no op and adds no
    variable there, so the block is synced once, after the last."""
    block._sync_with_cpp = lambda: None  # the instance's, over the class's method
    try:
        for old, new in renames.items():
            block._rename_var(old, new)
    finally:
        del block._sync_with_cpp
    block._sync_with_cpp()


def replace_program(program, other):
    """``program`` becomes ``other`` in place (callers hold ``program`` already)."""
    program._rebuild_from_desc(other.desc)


def fleet_initialized():
    return bool(fleet.fleet._role_maker)


def applied_meta_optimizers():
    return fleet.fleet._get_applied_meta_list()


def insert_asp_masks(main, startup, parameters):
    """What ``asp.decorate`` does after ``minimize``: a mask variable for every supported
    parameter, multiplied into it after each update."""
    asp.ASPHelper._create_mask_variables(main, startup, parameters)
    asp.ASPHelper._insert_sparse_mask_ops(main, parameters)


def job_store():
    """The key-value store of the job (``paddle.base.core.TCPStore``, one per process):
    served by rank 0 at the launcher's PADDLE_MASTER, every rank connected. Its first call
    in each rank is a rendezvous of all ranks; Paddle 3 makes its own communicators over
    the same store. Its ``get`` of a missing key blocks with the GIL held and aborts the
    process at its timeout: poll ``add(key, 0)``, which answers at once."""
    return core.create_or_get_global_tcp_store()


def pir_active():
    """Whether programs built now are PIR programs (``static_ir``'s switch)."""
    return PADDLE3 and bool(paddle.base.framework.global_var._use_pir_api_)


def make_ring0(rank, endpoints, place, device_id):
    """Ring 0, which every collective op of this process's programs uses (gradients,
    evaluation counts, AMP's found-inf flag, the parameters' broadcast), made once before
    any program in every mode: eval_only never reaches Fleet's ``minimize``, Fleet does not
    transpile PIR programs, and only ``minimize`` wrote NCCL's set-up into a startup
    program (``fleet_on_ring0`` now skips it). Returns how the ring was made:

    - no GPU (``device_id`` None): gloo (``init_gloo_ring``);
    - GPUs, PIR: NCCL's context registered by ring id over the job's store, as Paddle's
      ``paddle.distributed.collective._init_parallel_env("nccl")`` does
      (``pd_op.all_reduce_`` looks ring "0" up in ``CommContextManager``);
    - GPUs, legacy IR: Fleet's own ops (``CollectiveHelper._init_communicator``, as
      ``RawProgramOptimizer._init_process_group`` writes them), in a program run now."""
    if device_id is None:
        init_gloo_ring(rank, endpoints)
        return "gloo"
    if pir_active():
        key = hashlib.md5(("".join(endpoints) + "ring_id:0").encode()).hexdigest()
        core.CommContextManager.set_device_id(device_id)
        core.CommContextManager.create_nccl_comm_context(
            job_store(), "0", rank, len(endpoints), key
        )
        return "nccl"
    program = paddle.static.Program()
    CollectiveHelper(None, wait_port=False)._init_communicator(
        program, endpoints[rank], endpoints, rank, 0, True, 0, True
    )
    paddle.static.Executor(place).run(program)
    return "nccl-program"


def init_gloo_ring(rank, endpoints):
    """Ring 0 over gloo, for the collective ops of every program of this process."""
    if PADDLE3:
        # Paddle 3.x looks communicators up by ring id: gloo's context is registered
        # with its communicator manager, over the job's store.
        core.CommContextManager.create_gloo_comm_context(job_store(), "0", rank, len(endpoints))
    else:
        # Rank 0's endpoint carries NCCL's id exchange on GPUs; on CPUs it is free for
        # gloo's rendezvous store.
        paddle.distributed.gloo_init_parallel_env(rank, len(endpoints), endpoints[0])


@contextlib.contextmanager
def _replaced(owner, name, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


# Fleet's own, which the stand-in below calls for any ring but 0
_FLEET_INIT_COMMUNICATOR = CollectiveHelper._init_communicator


def _ring0_made_already(self, program, current_endpoint, endpoints, rank, ring_id, *args, **kwargs):
    """Stands in for CollectiveHelper._init_communicator around Fleet's ``minimize``: ring
    0 exists (``make_ring0``); any other ring is Fleet's to make."""
    if current_endpoint is None or ring_id != 0:
        return _FLEET_INIT_COMMUNICATOR(
            self, program, current_endpoint, endpoints, rank, ring_id, *args, **kwargs
        )


def _keep_single_check(*args, **kwargs):
    """Stands in for OptimizerWithMixedPrecision._set_distributed on Paddle 3 CPU ranks:
    one finite check over all gradients, which are already summed over the ranks."""


@contextlib.contextmanager
def fleet_on_ring0(gloo):
    """Around Fleet's ``minimize`` of a multi-rank job: Fleet's NCCL/BKCL set-up of ring 0
    is skipped (``make_ring0`` made it before any program, on every backend); on CPU ranks
    (``gloo``) of Paddle 3, AMP's per-parameter finite check for distributed runs (a GPU
    overlap optimisation whose ``paddle.any`` rejects legacy static variables) is not
    switched on."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(CollectiveHelper, "_init_communicator", _ring0_made_already))
        if PADDLE3 and gloo:
            stack.enter_context(
                _replaced(OptimizerWithMixedPrecision, "_set_distributed", _keep_single_check)
            )
        yield
