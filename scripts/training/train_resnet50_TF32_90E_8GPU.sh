#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA Paddle recipe, 90 epochs, TF32, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_90e 8 TF32 "$@"
