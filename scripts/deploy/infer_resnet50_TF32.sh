#!/usr/bin/env bash
# TensorRT FP32 (TF32 on Ampere) benchmark of an exported ResNet-50 (GPU).
exec bash "$(dirname "$0")/infer.sh" "${1:-inference/resnet50}" trt FP32 "${@:2}"
