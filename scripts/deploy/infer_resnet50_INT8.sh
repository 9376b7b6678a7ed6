#!/usr/bin/env bash
# TensorRT INT8 benchmark, calibrated on validation images (GPU; pass --image-root).
exec bash "$(dirname "$0")/infer.sh" "${1:-inference/resnet50}" trt INT8 --trt-use-calib-mode "${@:2}"
