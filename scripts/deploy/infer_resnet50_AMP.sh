#!/usr/bin/env bash
# TensorRT FP16 benchmark of an exported ResNet-50 (GPU).
exec bash "$(dirname "$0")/infer.sh" "${1:-inference/resnet50}" trt FP16 "${@:2}"
