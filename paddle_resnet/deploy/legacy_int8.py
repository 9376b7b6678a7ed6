"""What the program of a quantized legacy export holds that its ONNX conversion needs
(``onnx_export``): the int8 ranges of the classifier's input, which paddle2onnx 1.2.11
drops. Its PIR counterpart is ``pir_int8``."""

import numpy as np

from paddle_resnet.deploy.exported import loaded


def matmul_input_ranges(model_dir):
    """{weight name: the int8 range of its input} for each matmul of a quantized legacy
    export whose input and weight are both quantized (the classifier)."""
    with loaded(model_dir) as (program, scope):
        ops = program.global_block().ops
        dequantized = {op.output("Y")[0]: op for op in ops if op.type == "dequantize_linear"}
        ranges = {}
        for op in ops:
            if op.type not in ("mul", "matmul", "matmul_v2"):
                continue
            data, weight = (dequantized.get(op.input(slot)[0]) for slot in ("X", "Y"))
            if data is not None and weight is not None:
                scale = np.array(scope.find_var(data.input("Scale")[0]).get_tensor())
                ranges[weight.input("X")[0]] = float(scale.reshape(-1)[0])
        return ranges
