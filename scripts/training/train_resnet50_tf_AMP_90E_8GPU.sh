#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA TensorFlow recipe, 90 epochs, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnet50_tf_90e 8 AMP "$@"
