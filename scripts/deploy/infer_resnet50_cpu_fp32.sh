#!/usr/bin/env bash
# oneDNN fp32 benchmark of an exported ResNet-50 (CPU).
exec bash "$(dirname "$0")/infer.sh" "${1:-inference/resnet50}" cpu fp32 "${@:2}"
