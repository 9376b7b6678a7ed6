"""What an exported model is fed: images through the DALI validation pipeline,
preprocessed as the model was exported (its model.json). Kept out of the serving files
so that reading and running an exported model needs no DALI."""

import dataclasses

from paddle_resnet.data.dali import make_loader


def preprocessing(data_config, info):
    """``data_config`` with the validation preprocessing the model was exported with."""
    pre = info["preprocess"]
    return dataclasses.replace(
        data_config,
        crop_size=pre["crop_size"],
        resize_short=pre["resize_short"],
        normalize_mean=tuple(pre["normalize_mean"]),
        normalize_std=tuple(pre["normalize_std"]),
        normalize_scale=pre.get("normalize_scale", 1.0 / 255.0),
        output_fp16=False,
    )  # the predictor's input is fp32


def validation_batches(data_split, data_config, info):
    """Batches of ``data_split`` through the validation pipeline, as the model was exported."""
    layout, shape = info["layout"], info["input_shape"]
    channels = shape[0] if layout == "NCHW" else shape[-1]
    return make_loader(
        data_split, preprocessing(data_config, info), layout, training=False, channels=channels
    )
