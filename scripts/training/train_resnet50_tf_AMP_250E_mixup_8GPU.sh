#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA TensorFlow recipe, 250 epochs with MixUp, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnet50_tf_250e_mixup 8 AMP "$@"
