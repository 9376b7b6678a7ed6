#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA Paddle recipe, 90 epochs, TF32, 1 GPU.
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_90e 1 TF32 "$@"
