#!/usr/bin/env bash
# ResNeXt101-32x4d, NVIDIA TensorFlow recipe, 250 epochs with MixUp, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnext101_32x4d_tf_250e_mixup 8 AMP "$@"
