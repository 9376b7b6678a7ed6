"""What an exported model is fed: images through the DALI validation pipeline,
preprocessed as the model was exported (its model.json). Kept out of ``exported.py`` so
that reading and running an exported model needs no DALI."""

from paddle_resnet.data.dali import make_loader
from paddle_resnet.deploy.exported import preprocessing


def validation_batches(data_split, data_config, info):
    """Batches of ``data_split`` preprocessed as the model was exported (the validation
    pipeline): what accuracy, prediction and INT8 calibration feed the model."""
    shape = info["input_shape"]
    channels = shape[0] if info["layout"] == "NCHW" else shape[-1]
    return make_loader(
        data_split,
        preprocessing(data_config, info),
        info["layout"],
        training=False,
        channels=channels,
    )
