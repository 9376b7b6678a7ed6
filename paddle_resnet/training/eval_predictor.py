"""Evaluation on the CPU through Paddle Inference, from the eval program in memory: the
executor runs plain kernels one op at a time (ResNet-18 at 32 px: about 400 img/s on 2
cores), Paddle Inference with its passes and oneDNN (about 3,500 img/s). Before each
evaluation the program and the current weights are serialized in memory and handed to a
predictor (on PIR, which has none, through a temporary ``save_inference_model``).

The predictor gives the training's math threads back after each run: Paddle Inference
ends every run by setting MKL and OpenMP to one thread (analysis_predictor.cc, 2.6 and
3.x), so the training after a validation ran on one core and rounded unlike a run
resumed after it (0.05 apart after 4 steps).
"""

import os
import tempfile

import numpy as np
import paddle
import paddle.inference as paddle_infer

from paddle_resnet.core import bootstrap, feeds, paddle_internals
from paddle_resnet.core.bootstrap import native_chatter
from paddle_resnet.training import ir


def usable(config, on_gpu):
    """Where the predictor evaluates: the CPU, an fp32 eval program (a QAT eval program's
    fake quantizers are a training form; bf16 AMP's O1 evaluates in fp32)."""
    return not on_gpu and not config.qat.enabled and not config.amp.use_pure_fp16


def _config(program, inputs, outputs, exe, prefix, threads):
    """The predictor's Config of ``program`` and the scope's weights: in memory (legacy
    IR), or through files at ``prefix`` (PIR). The settings come before the weights:
    each setter copies a Config's model buffer again (0.2 s of ResNet-18's 0.9)."""
    pir = paddle_internals.is_pir_program(program)
    if pir:
        paddle.static.save_inference_model(prefix, inputs, outputs, exe, program=program)
        config = paddle_infer.Config(prefix + ".json", prefix + ".pdiparams")
    else:
        config = paddle_infer.Config()
    config.disable_gpu()
    config.set_cpu_math_library_num_threads(threads)
    config.switch_ir_optim(True)
    config.enable_mkldnn()
    config.disable_glog_info()
    if not pir:
        model = paddle.static.serialize_program(inputs, outputs, program=program)
        params = paddle.static.serialize_persistables(inputs, outputs, exe, program=program)
        config.set_model_buffer(model, len(model), params, len(params))
    return config


class EvalPredictor:
    """``predictor(feed) -> (top-k classes, per-image losses)`` of the eval program with
    the scope's current weights."""

    def __init__(self, programs, exe):
        self.threads = bootstrap.math_threads()
        program = programs.eval
        inputs = [ir.feed_target(program, name) for name in (feeds.IMAGE, feeds.LABEL)]
        outputs = [programs.eval_fetches["topk"], programs.eval_fetches["loss"]]
        with tempfile.TemporaryDirectory() as folder:
            config = _config(
                program, inputs, outputs, exe, os.path.join(folder, "eval"), self.threads
            )
            with native_chatter(bootstrap.verbose()):
                self.predictor = paddle_infer.create_predictor(config)
        self.inputs = [self.predictor.get_input_handle(n) for n in (feeds.IMAGE, feeds.LABEL)]
        self.outputs = [
            self.predictor.get_output_handle(n) for n in self.predictor.get_output_names()
        ]

    def __call__(self, feed):
        for handle, name in zip(self.inputs, (feeds.IMAGE, feeds.LABEL)):
            value = np.ascontiguousarray(np.asarray(feed[name]))
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(value)
        self.predictor.run()
        paddle_internals.set_math_threads(self.threads)  # set to 1 by the run
        return [handle.copy_to_cpu() for handle in self.outputs]
