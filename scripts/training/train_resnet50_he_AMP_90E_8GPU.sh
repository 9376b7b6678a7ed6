#!/usr/bin/env bash
# Canonical He et al. ResNet-50 (Nesterov, step LR, zero-init residual), 90 epochs, AMP, 8 GPUs.
exec bash "$(dirname "$0")/launch.sh" resnet50_he_90e 8 AMP "$@"
