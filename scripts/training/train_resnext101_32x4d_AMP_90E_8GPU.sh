#!/usr/bin/env bash
# ResNeXt101-32x4d, NVIDIA TensorFlow recipe, 90 epochs, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnext101_32x4d_tf_90e 8 AMP "$@"
