"""The GPU programs, built for real by the GPU build of Paddle (paddlepaddle-gpu) and
checked as data: they are not executed here (no GPU), but every cast, fusion, loss-scaling
op, mask and quantizer that a GPU would run is in the program and is checked here.

The expectations come from Paddle's AMP op lists (``AutoMixedPrecisionLists``: white ops
compute in fp16, black ops in fp32, batch norm keeps fp32 statistics and affine
parameters) and from the architecture (a ResNet-50 has 16 bottleneck blocks, 4 of them
with a projection shortcut), not from a snapshot of our own output.
"""

import collections

import numpy as np
import paddle
import pytest
from paddle.static.amp.fp16_lists import AutoMixedPrecisionLists

from conftest import small_config
from paddle_resnet.core import feeds
from paddle_resnet.core.config import build_config
from paddle_resnet.models import model_entry
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import gpu_tuning, prepare, run_folder
from paddle_resnet.training import programs as program
from paddle_resnet.training.qat import quantize_eval_program
from paddle_resnet.training.sparsity.pattern import MASK_SUFFIX
from paddle_resnet.training.weights import into_program

pytestmark = [pytest.mark.cuda_build, pytest.mark.gpu_wheel]

AMP_LISTS = AutoMixedPrecisionLists()
BATCH_NORMS = ("batch_norm", "fused_batch_norm_act", "fused_bn_add_activation")
BN_STATE = ("Scale", "Bias", "Mean", "Variance")
FP16, FP32 = paddle.float16, paddle.float32
# NVIDIA's AMP settings (scripts/training/launch.sh AMP): loss scaling from 128, dynamic.
NVIDIA_AMP = {"amp.enabled": True, "amp.scale_loss": 128.0, "amp.use_dynamic_loss_scaling": True}


def resnet50(**values):
    return build_config(
        dict(
            {"model.arch": "resnet50", "data.crop_size": 224, "run.epochs": 10},
            **NVIDIA_AMP,
            **values,
        )
    )


def build_for_gpu(config):
    return program.build_programs(config, steps_per_epoch=10, global_batch=256, on_gpu=True)


def ops(prog, *types):
    return [op for op in prog.global_block().ops if not types or op.type in types]


def dtype(prog, name):
    return prog.global_block().var(name).dtype


def float_inputs(prog, op, slots=None):
    """{input name: dtype} of the floating-point inputs of ``op`` (in ``slots``)."""
    names = [n for slot in (slots or op.input_names) for n in op.input(slot)]
    return {n: dtype(prog, n) for n in names if dtype(prog, n) in (FP16, FP32)}


def counts(prog):
    return collections.Counter(op.type for op in ops(prog))


def architecture(name):
    arch = model_entry(name).spec
    blocks = sum(arch.layers)
    projections = sum(1 for layer in arch.layers if layer)  # each stage's first block
    return blocks, projections


def assert_fused_ops_pair_up(prog):
    """Each fused backward op has its forward op: a fused gradient over an unfused forward
    reads outputs the forward never wrote."""
    kinds = counts(prog)
    for kind, number in kinds.items():
        if kind.startswith("fused") and kind.endswith("_grad"):
            assert kinds[kind[: -len("_grad")]] == number, kind


def assert_mixed_precision(prog):
    """Paddle's AMP lists, op by op: white ops read fp16, black ops fp32, batch norms keep
    fp32 statistics and affine parameters."""
    # (fused_bn_add_activation is on the white list too: its X is fp16, its state below)
    white = [op for op in ops(prog) if op.type in AMP_LISTS.white_list - set(BATCH_NORMS)]
    assert {op.type for op in white} >= {"conv2d", "matmul_v2"}
    for op in white:
        assert set(float_inputs(prog, op).values()) == {FP16}, (op.type, float_inputs(prog, op))
    black = [op for op in ops(prog) if op.type in AMP_LISTS.black_list]
    assert {op.type for op in black} >= {"softmax_with_cross_entropy", "reduce_mean"}
    for op in black:
        assert set(float_inputs(prog, op).values()) == {FP32}, (op.type, float_inputs(prog, op))
    for op in ops(prog, *BATCH_NORMS):
        assert set(float_inputs(prog, op, BN_STATE).values()) == {FP32}, op.type
        assert set(float_inputs(prog, op, ["X"]).values()) == {FP16}, op.type


def assert_dynamic_loss_scaling(programs, initial):
    (update,) = ops(programs.train, "update_loss_scaling")
    assert len(ops(programs.train, "check_finite_and_unscale")) == 1
    scaling = update.input("PrevLossScaling")[0]
    (init,) = [
        op for op in ops(programs.startup, "fill_constant") if op.output("Out")[0] == scaling
    ]
    assert init.attr("value") == initial
    assert update.attr("incr_every_n_steps") > 0 and update.attr("decr_ratio") < 1


def test_amp_nhwc_resnet50_is_nvidias_fused_mixed_precision_program():
    """NVIDIA's default: AMP O1, NHWC, dynamic loss scaling from 128, the build strategy's
    fusions applied to the program."""
    programs = build_for_gpu(resnet50(**{"model.data_layout": "NHWC"}))
    assert_mixed_precision(programs.train)
    assert_dynamic_loss_scaling(programs, 128.0)
    # O1 keeps fp32 parameters; each weight reaches its convolution through one fp16 cast
    assert {p.dtype for p in programs.train.all_parameters()} == {FP32}
    for op in ops(programs.train, "conv2d"):
        assert op.input("Filter")[0].endswith(".cast_fp16")
    # cuDNN's fusions, counted from the architecture: batch norm + ReLU after the stem
    # and the first two convolutions of each block, batch norm + addition + ReLU at each
    # block's end, plain batch norm on the projection shortcuts
    blocks, projections = architecture("resnet50")
    kinds = counts(programs.train)
    assert kinds["conv2d"] == 3 * blocks + projections + 1
    assert kinds["fused_batch_norm_act"] == 1 + 2 * blocks
    assert kinds["fused_bn_add_activation"] == blocks
    assert kinds["batch_norm"] == projections
    assert kinds["share_buffer"] > 0  # enable_addto's in-place sums
    assert_fused_ops_pair_up(programs.train)
    # the eval program runs compiled with fix_op_run_order
    assert programs.eval_compiled is not None
    assert programs.eval_compiled._build_strategy.fix_op_run_order


def test_amp_nchw_fuses_additions_but_not_batch_norms():
    """cuDNN's batch-norm + activation kernels need NHWC: in NCHW only the residual
    additions and their ReLUs fuse."""
    programs = build_for_gpu(resnet50())
    assert_mixed_precision(programs.train)
    blocks, projections = architecture("resnet50")
    kinds = counts(programs.train)
    assert kinds["fused_elemwise_add_activation"] == blocks
    assert kinds["batch_norm"] == 3 * blocks + projections + 1
    assert "fused_batch_norm_act" not in kinds
    assert_fused_ops_pair_up(programs.train)


def test_cpu_programs_of_the_gpu_build_stay_unfused():
    """Built for the CPU (no GPU here), the same configuration gets no fusion passes."""
    programs = program.build_programs(
        resnet50(), steps_per_epoch=10, global_batch=256, on_gpu=False
    )
    assert not [kind for kind in counts(programs.train) if kind.startswith("fused")]
    assert programs.eval_compiled is None
    assert not paddle.get_flags([gpu_tuning.APPLY_PASSES])[gpu_tuning.APPLY_PASSES]


def test_pure_fp16_keeps_fp32_masters_and_an_fp16_eval_program(tmp_path):
    config = resnet50(
        **{"amp.use_pure_fp16": True, "model.data_layout": "NHWC", "data.output_fp16": True}
    )
    programs = build_for_gpu(config)
    # DALI's fp16 images go straight into the first convolution
    assert dtype(programs.train, feeds.IMAGE) == FP16
    assert not [op for op in ops(programs.train, "cast") if op.input("X")[0] == feeds.IMAGE]
    statistics = {n for op in ops(programs.train, *BATCH_NORMS) for n in op.input_arg_names}
    weights = [p for p in programs.train.all_parameters() if p.name not in statistics]
    assert {p.dtype for p in weights} == {FP16}  # convolutions, classifier
    masters = into_program.master_weights(programs.train)
    assert set(masters) == {p.name for p in weights}
    for op in ops(programs.train, "momentum"):
        if op.input("Param")[0] in masters:
            assert op.attr("multi_precision")
            assert dtype(programs.train, op.input("MasterParam")[0]) == FP32
    for op in ops(programs.train, *BATCH_NORMS):
        assert set(float_inputs(programs.train, op, BN_STATE).values()) == {FP32}
    (loss,) = ops(programs.train, "softmax_with_cross_entropy")
    assert set(float_inputs(programs.train, loss).values()) == {FP32}
    assert_fused_ops_pair_up(programs.train)

    # amp_init (run here on the CPU, as train.py runs it after the startup program):
    # fp16 parameters in the scope, an fp16 eval program
    place = paddle.CPUPlace()
    paddle.static.Executor(place).run(programs.startup)
    prepare.init_pure_fp16(programs, place)
    scope = paddle.static.global_scope()
    first = weights[0].name
    assert np.array(scope.find_var(first).get_tensor()).dtype == np.float16
    for op in ops(programs.eval, "conv2d", "matmul_v2"):
        assert set(float_inputs(programs.eval, op).values()) == {FP16}, op.type


def test_pretrained_weights_reach_the_pure_fp16_masters(trained):
    """Loaded after the startup program cast the random initialisation into the fp32
    masters: without updating them, the first step would bring that initialisation back."""
    config = build_config(
        dict(
            {f"{s}.{k}": v for s, entries in trained.to_dict().items() for k, v in entries.items()},
            **NVIDIA_AMP,
            **{"amp.use_pure_fp16": True},
        )
    )
    programs = build_for_gpu(config)
    place = paddle.CPUPlace()
    paddle.static.Executor(place).run(programs.startup)
    prepare.init_pure_fp16(programs, place)
    folder = run_folder.checkpoint_dir(trained.run.output_dir, "resnet18", 3)
    state = ckpt.read_checkpoint(folder)[1]
    into_program.load_pretrained(programs.train, state, folder, "resnet18")
    scope = paddle.static.global_scope()
    masters = into_program.master_weights(programs.train)
    assert masters
    for param, master in masters.items():
        np.testing.assert_array_equal(
            np.array(scope.find_var(master).get_tensor()),
            state[param].astype(np.float32),
            err_msg=param,
        )
        np.testing.assert_array_equal(
            np.array(scope.find_var(param).get_tensor()),
            state[param].astype(np.float16),
            err_msg=param,
        )


def test_asp_with_amp_masks_the_fp32_weights_after_each_update():
    programs = build_for_gpu(resnet50(**{"asp.enabled": True, "model.data_layout": "NHWC"}))
    assert_mixed_precision(programs.train)
    # every convolution (pruning later leaves the 3-channel stem dense: too few input
    # channels); the classifier is excluded by default
    convolutions = {
        op.input("Filter")[0].replace(".cast_fp16", "") for op in ops(programs.train, "conv2d")
    }
    block = programs.train.global_block()
    order = {id(op): index for index, op in enumerate(block.ops)}
    masked = {}
    for op in ops(programs.train, "elementwise_mul"):
        if op.input("Y")[0].endswith(MASK_SUFFIX):
            masked[op.input("X")[0]] = op
    assert set(masked) == convolutions
    updates = {op.input("Param")[0]: op for op in ops(programs.train, "momentum")}
    for name, mask_op in masked.items():
        assert dtype(programs.train, name) == FP32
        assert order[id(updates[name])] < order[id(mask_op)], name  # mask after update
    assert_fused_ops_pair_up(programs.train)


def test_qat_with_amp_quantizes_both_programs_and_keeps_the_scales_evaluable():
    """NVIDIA's QAT recipe (scripts/training/train_resnet50_AMP_QAT_10E_8GPU.sh: AMP, NHWC,
    QAT, 10 epochs at LR 5e-5): every convolution and the classifier read dequantized
    inputs and weights in both programs, and the eval program finds every trained scale
    of the train program under its own name."""
    config = resnet50(
        **{"qat.enabled": True, "model.data_layout": "NHWC", "run.epochs": 10, "lr.base": 0.00005}
    )
    programs = build_for_gpu(config)
    place = paddle.CPUPlace()
    paddle.static.Executor(place).run(programs.startup)
    quantize_eval_program(programs.eval, place)
    for prog, precision in ((programs.train, FP16), (programs.eval, FP32)):
        producers = {name: op.type for op in ops(prog) for name in op.output_arg_names}
        quantized = ops(prog, "conv2d", "matmul_v2")
        assert len(quantized) == 53 + 1
        for op in quantized:
            inputs = float_inputs(prog, op)
            assert len(inputs) == 2, (op.type, inputs)  # the activation and the weight
            for name in inputs:
                assert producers[name] == "dequantize_linear", (op.type, name)
                assert dtype(prog, name) == precision
    assert "cast" in counts(programs.train) and "cast" not in counts(programs.eval)
    scales = {n for op in ops(programs.eval, "quantize_linear") for n in op.input("Scale")}
    trained_names = {v.name for v in into_program.persistable_variables(programs.train)}
    assert scales and scales <= trained_names
    assert_fused_ops_pair_up(programs.train)


def test_sync_bn_converts_every_batch_norm_of_the_train_program():
    config = build_config(
        {
            "model.arch": "resnet18",
            "data.crop_size": 32,
            "run.epochs": 1,
            "lr.warmup_epochs": 0,
            "run.sync_bn": True,
        }
    )
    programs = build_for_gpu(config)
    kinds = counts(programs.train)
    assert kinds["sync_batch_norm"] == 20 and "batch_norm" not in kinds
    assert "sync_batch_norm" not in counts(programs.eval)  # evaluation uses the statistics


def test_dali_fp16_output_feeds_amp_without_casts(fmnist_root, tmp_path):
    config = small_config(fmnist_root, tmp_path, **NVIDIA_AMP, **{"data.output_fp16": True})
    programs = build_for_gpu(config)
    first_conv = ops(programs.train, "conv2d")[0]
    assert first_conv.input("Input") == [feeds.IMAGE]
    assert dtype(programs.train, feeds.IMAGE) == FP16
    # the eval program (fp32) casts the fp16 images once
    (cast,) = [op for op in ops(programs.eval, "cast") if op.input("X") == [feeds.IMAGE]]
    assert cast.attr("out_dtype") == paddle.base.core.VarDesc.VarType.FP32


def test_nvidia_cudnn_flags_are_flags_of_the_gpu_build():
    """NVIDIA's cuDNN settings (exhaustive algorithm search, a 4 GB workspace limit) are
    taken by the GPU build as they are named: set, then read back from Paddle."""
    names = ["FLAGS_cudnn_exhaustive_search", "FLAGS_conv_workspace_size_limit"]
    before = paddle.get_flags(names)
    try:
        gpu_tuning.apply_cudnn_flags()
        assert paddle.get_flags(names) == {
            "FLAGS_cudnn_exhaustive_search": True,
            "FLAGS_conv_workspace_size_limit": 4096,
        }
    finally:
        paddle.set_flags(before)
