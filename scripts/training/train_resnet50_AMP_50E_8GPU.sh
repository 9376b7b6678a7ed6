#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA Paddle recipe, 50 epochs, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnet50_paddle_50e 8 AMP "$@"
