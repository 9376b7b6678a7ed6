"""The toolkit's fused CPU training kernels (``training/cpu_ops``, --cpu-fused-bn): batch
norm on the batch's statistics with the addition and ReLU after it, forward and backward,
against Paddle's own batch norm, addition and ReLU and a float64 reference; bf16 within
its rounding; the train program (only) built on them; one line where they cannot be
built. On each IR the running Paddle has."""

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from conftest import (
    PADDLE3,
    assert_same_state,
    pir_rehearsal,
    small_config,
    straight_and_resumed,
)
from paddle_resnet.core import bootstrap, feeds
from paddle_resnet.core.errors import ConfigError
from paddle_resnet.training import checkpoint as ckpt
from paddle_resnet.training import cpu_ops, ir
from paddle_resnet.training import programs as program

IRS = ["pir"] if bootstrap.pir_only() else (["legacy", "pir"] if PADDLE3 else ["legacy"])
# 4 x 8 x 4 x 8: 1,024 elements, so the gradient of a mean is exact in bf16
SHAPE = (4, 8, 4, 8)
COUNT = SHAPE[0] * SHAPE[2] * SHAPE[3]  # elements a channel's statistics sum over
FP32_UNIT = 2.0**-24  # fp32's unit roundoff
BF16_UNIT = 2.0**-8  # bf16's, 8 bits of significand: relative error of one rounding


def _as_bf16(values):
    """``values`` rounded to bf16 (nearest even) and held in fp32."""
    bits = values.astype("float32").view("uint32")
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype("uint32").view("float32")


def _inputs():
    rng = np.random.default_rng(0)
    return {  # x far from zero mean: the statistics must not cancel
        "x": _as_bf16(rng.standard_normal(SHAPE) * 2 + 3),
        "r": _as_bf16(rng.standard_normal(SHAPE)),
        "g": _as_bf16(rng.standard_normal(SHAPE)),
    }


def _run(ir_name, kernel, residual, relu, dtype="float32"):
    """[y, dx, (dr,) dscale, dbias, running mean, running variance] of one training step of
    ``kernel`` ("ours" or "paddle") on ``_inputs``; loss = mean(y * g)."""
    config = small_config("unused", "unused", **{"run.ir": ir_name})
    paddle.enable_static()
    feed = _inputs()
    with ir.selected(config):
        return _step(feed, kernel, residual, relu, dtype)


def _step(feed, kernel, residual, relu, dtype):
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x, r, g = (paddle.static.data(name, SHAPE, "float32") for name in ("x", "r", "g"))
        x.stop_gradient = r.stop_gradient = False
        channels = SHAPE[1]
        bn = paddle.nn.BatchNorm2D(
            channels,
            momentum=0.9,
            epsilon=1e-5,
            weight_attr=paddle.ParamAttr(
                initializer=paddle.nn.initializer.Assign(np.linspace(0.5, 1.5, channels))
            ),
            bias_attr=paddle.ParamAttr(
                initializer=paddle.nn.initializer.Assign(np.linspace(-1, 1, channels))
            ),
        )
        shortcut = r if residual else None
        if kernel == "ours":
            ops, why = cpu_ops.loaded()
            assert ops is not None, why
            low = (paddle.cast(x, dtype), None if shortcut is None else paddle.cast(r, dtype))
            y = paddle.cast(ops.bn_act(bn, *low, relu=relu), "float32")
        else:
            y = F.batch_norm(x, bn._mean, bn._variance, bn.weight, bn.bias, True, 0.9, 1e-5)
            y = paddle.add(y, r) if residual else y
            y = F.relu(y) if relu else y
        loss = paddle.mean(y * g)
        wrt = [x, r, bn.weight, bn.bias] if residual else [x, bn.weight, bn.bias]
        grads = paddle.static.gradients([loss], wrt)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            outs = exe.run(main, feed=feed, fetch_list=[y, *grads])
            stats = [
                np.array(scope.find_var(v.name).get_tensor()) for v in (bn._mean, bn._variance)
            ]
    return [np.asarray(o, "float64") for o in outs] + stats


def _float64(residual, relu):
    """The same step in NumPy's float64."""
    feed = {k: v.astype("float64") for k, v in _inputs().items()}
    x, r, g = feed["x"], feed["r"], feed["g"]
    channels = SHAPE[1]
    gamma = np.linspace(0.5, 1.5, channels).reshape(1, -1, 1, 1)
    beta = np.linspace(-1, 1, channels).reshape(1, -1, 1, 1)
    axes = (0, 2, 3)
    mean, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + 1e-5)
    z = gamma * xhat + beta + (r if residual else 0)
    y = np.maximum(z, 0) if relu else z
    dz = g / g.size * (z > 0 if relu else 1)
    dgamma, dbeta = (dz * xhat).sum(axes), dz.sum(axes)
    dx = (
        gamma
        / np.sqrt(var + 1e-5)
        * (dz - dz.mean(axes, keepdims=True) - xhat * (dz * xhat).mean(axes, keepdims=True))
    )
    running = (0.1 * mean.ravel(), 0.9 + 0.1 * var.ravel())  # from 0 and 1, momentum 0.9
    return [y, dx, *([dz] if residual else []), dgamma, dbeta, *running]


def _fp32_bound(reference):
    # Each value is at most one fp32 sum over COUNT terms and a few further operations
    # away from its inputs: |error| <= (COUNT + 8) * u * (its magnitude's scale).
    return (COUNT + 8) * FP32_UNIT * np.abs(reference).max()


@pytest.mark.parametrize("ir_name", IRS)
@pytest.mark.parametrize("residual, relu", [(False, True), (True, True), (False, False)])
def test_fused_kernels_equal_paddles_batch_norm_add_and_relu(ir_name, residual, relu):
    """fp32: the output, every gradient and both running statistics within fp32's bound
    of float64, as Paddle's own kernels are."""
    exact = _float64(residual, relu)
    ours = _run(ir_name, "ours", residual, relu)
    paddles = _run(ir_name, "paddle", residual, relu)
    assert len(exact) == len(ours) == len(paddles) == (7 if residual else 6)
    for index, reference in enumerate(exact):
        bound = _fp32_bound(reference)
        for got in (ours, paddles):
            assert np.abs(got[index] - reference).max() <= bound, (index, bound)


@pytest.mark.parametrize("ir_name", IRS)
def test_bf16_kernels_differ_from_fp32_by_their_rounding(ir_name):
    """On the same bf16 inputs the bf16 kernels compute as the fp32 ones and round each
    written value once: |bf16 - fp32| <= u_bf16 * |value| (+ fp32's bound); the
    parameters' gradients and the statistics are fp32 sums of the same values."""
    fp32 = _run(ir_name, "ours", True, True)
    bf16 = _run(ir_name, "ours", True, True, dtype="bfloat16")
    rounded = (0, 1, 2)  # y, dx, dr: written in bf16
    assert len(fp32) == len(bf16) == 7
    for index, (exact, low) in enumerate(zip(fp32, bf16)):
        bound = _fp32_bound(exact) + (BF16_UNIT * np.abs(exact) if index in rounded else 0)
        assert (np.abs(low - exact) <= bound).all(), index


def test_the_train_program_trains_through_them_and_evaluation_does_not(fmnist_root, tmp_path):
    config = small_config(fmnist_root, tmp_path, **{"run.cpu_fused_bn": True})
    built = program.build_programs(config, steps_per_epoch=10, global_batch=16)
    train_ops, eval_ops = ir.op_sequence(built.train), ir.op_sequence(built.eval)
    # ResNet-18: 20 batch norms, 8 of them with the block's addition, each with its gradient
    for name, count in (("prn_bn_act", 12), ("prn_bn_add_act", 8)):
        assert sum(t.split(".")[-1].rstrip("_") == name for t in train_ops) == count
        assert sum(t.split(".")[-1] == name + "_grad" for t in train_ops) == count
    assert not any(("batch_norm" in t or "relu" in t) for t in train_ops)
    assert not any("prn_" in t for t in eval_ops)
    assert sum("batch_norm" in t for t in eval_ops) == 20


@pytest.mark.skipif(not PADDLE3, reason="PIR: Paddle 3")
def test_on_pir_a_onednn_convolutions_output_is_refused_not_read_as_nchw():
    """PIR hands a custom operator a oneDNN op's output in oneDNN's blocked layout,
    unconverted (the legacy executor converts it): read as NCHW it gave ResNet-18 a first
    loss of 2.67 for Paddle's 2.44. ``resolved`` keeps them apart (the next test); built
    together anyway, the kernels refuse the input (PIR's executor passes on no message)
    instead of computing from it."""
    values = {"run.ir": "pir", "run.cpu_fused_bn": True, "run.cpu_onednn": True}
    config = small_config("unused", "unused", **values)
    with ir.selected(config), paddle.static.scope_guard(paddle.static.Scope()):
        built = program.build_programs(config, steps_per_epoch=10, global_batch=16)
        assert "onednn_op.conv2d" in [op.name() for op in built.train.global_block().ops]
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(built.startup)
        feed = {
            feeds.IMAGE: np.random.default_rng(0).random((16, 3, 32, 32)).astype("float32"),
            feeds.LABEL: (np.arange(16) % 10).reshape(16, 1),
        }
        with pytest.raises(RuntimeError):
            exe.run(built.train, feed=feed, fetch_list=[built.train_fetches["loss"]])


def test_they_are_used_where_asked_and_refused_where_they_cannot_work(fmnist_root, tmp_path):
    def decided(world_size=1, **values):
        config = small_config(fmnist_root, tmp_path, **values)
        return cpu_ops.resolved(config, world_size)[0].run

    asked = {"run.cpu_fused_bn": True}
    assert not decided().cpu_fused_bn and decided(**asked).cpu_fused_bn
    refusals = (
        ({"amp.enabled": True, "amp.dtype": "bfloat16"}, "fp32 activations"),
        ({"model.data_layout": "NHWC"}, "NCHW activations"),
    )
    if PADDLE3:  # on PIR: Paddle's plain convolutions, chosen for the run where unset
        assert decided(**asked, **{"run.ir": "pir"}).cpu_onednn is False
        refusals += (
            ({"run.ir": "pir", "run.cpu_onednn": True}, "Paddle's plain convolutions on PIR"),
        )
    for values, why in refusals:
        with pytest.raises(ConfigError, match=f"--cpu-fused-bn takes {why}"):
            decided(**asked, **values)


def test_a_machine_that_cannot_build_them_trains_on_paddles_and_says_so(
    fmnist_root, tmp_path, monkeypatch
):
    monkeypatch.setenv("CXX", "no-such-compiler")
    cpu_ops.loaded.cache_clear()
    try:
        config = small_config(fmnist_root, tmp_path, **{"run.cpu_fused_bn": True})
        decided, line = cpu_ops.resolved(config, 1)
    finally:
        cpu_ops.loaded.cache_clear()
    assert decided.run.cpu_fused_bn is False
    assert line == (
        "CPU fused kernels: unavailable, no C++ compiler (g++; scripts/setup.sh installs it): "
        "Paddle's kernels"
    )


@pir_rehearsal
def test_resume_with_fused_kernels_is_bit_identical(fmnist_root, tmp_path):
    flags = ("--epochs", "2", "--run-scope", "train_only", "--cpu-fused-bn")
    straight, resumed, said = straight_and_resumed(fmnist_root, tmp_path, *flags)
    assert "CPU fused kernels: batch norm, addition and ReLU in one" in said
    assert_same_state(
        ckpt.read_checkpoint(str(resumed / "resnet18" / "2"))[1],
        ckpt.read_checkpoint(str(straight / "resnet18" / "2"))[1],
    )
