"""Paddle 3.3.1, PIR, CPU: a bf16 convolution (what ``paddle.amp.auto_cast(dtype="bfloat16")``
builds) runs oneDNN's fp32 primitive, behind bf16-to-fp32 reorders, unless the oneDNN op
carries ``onednn_data_type="bfloat16"``.

    ONEDNN_VERBOSE=1 python docs/repro/pir_bf16_conv_runs_fp32.py            # Paddle's lowering
    ONEDNN_VERBOSE=1 python docs/repro/pir_bf16_conv_runs_fp32.py --rewrite  # the attribute set

The plain CPU kernel of ``conv2d`` has no bf16; the executor falls back to the oneDNN one,
whose ``ConvOneDNNHandlerT`` takes the primitive's data type from the attribute, not from
its inputs. Without it oneDNN's log shows ``brg_conv_fwd:avx512_core,forward_inference,
src:f32``; with it (on an AMX CPU) ``brg_conv_fwd:avx10_1_512_amx,...,src:bf16``. The
backward primitives are bf16 either way (``conv2d_grad`` takes its type from its inputs).
What would mend it in Paddle: its kernel-lowering fallback (pd_op_to_kernel_pass) setting
the attribute from the kernel key's dtype. The toolkit sets it in its rewrite
(``paddle_internals.onednn_ops_on_pir``). Standalone: Paddle 3.3.1 and NumPy only.
"""

import os
import sys

os.environ["FLAGS_enable_pir_api"] = "1"

import numpy as np
import paddle


def rewrite_to_bf16_onednn(program):
    """pd_op.conv2d -> onednn_op.conv2d with the bf16 data type (a DRR pattern)."""
    attrs = ("strides", "paddings", "padding_algorithm", "dilations", "groups", "data_format")
    ctx = paddle.pir.DrrPatternContext()
    source = ctx.SourcePattern()
    source.Op("pd_op.conv2d", {a: source.Attr(a) for a in attrs})(
        [source.Tensor("input"), source.Tensor("filter")], [source.Tensor("out")]
    )
    result = source.ResultPattern()
    values = {a: source.Attr(a) for a in attrs}
    values.update(
        is_test=result.BoolAttr(False),
        force_fp32_output=result.BoolAttr(False),
        mkldnn_data_type=result.StrAttr("bfloat16"),
        onednn_data_type=result.StrAttr("bfloat16"),
    )
    result.Op("onednn_op.conv2d", values)(
        [result.Tensor("input"), result.Tensor("filter")], [result.Tensor("out")]
    )
    passes = paddle.pir.PassManager()
    passes.register_pass("bf16_conv", ctx)
    passes.run(program)


def main():
    paddle.enable_static()
    # the oneDNN dialect is registered when the executor first lowers a program
    warm = paddle.static.Program()
    with paddle.static.program_guard(warm, paddle.static.Program()):
        out = paddle.full([1], 1.0, "float32")
    paddle.static.Executor(paddle.CPUPlace()).run(warm, fetch_list=[out])

    main_program, startup = paddle.static.Program(), paddle.static.Program()
    main_program.random_seed = startup.random_seed = 1
    with paddle.static.program_guard(main_program, startup):
        x = paddle.static.data("x", [16, 64, 56, 56], "float32")
        weight = paddle.static.create_parameter([64, 64, 3, 3], "float32")
        y = paddle.nn.functional.conv2d(x.astype("bfloat16"), weight.astype("bfloat16"), padding=1)
        loss = paddle.mean(y.astype("float32"))
        paddle.optimizer.SGD(0.01).minimize(loss)
    if "--rewrite" in sys.argv:
        rewrite_to_bf16_onednn(main_program)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.random.default_rng(0).random((16, 64, 56, 56), "float32")}
    print("loss", exe.run(main_program, feed=feed, fetch_list=[loss])[0])


if __name__ == "__main__":
    main()
