#!/usr/bin/env bash
# oneDNN bf16 benchmark of an exported ResNet-50 (CPU with avx512_bf16 or AMX).
exec bash "$(dirname "$0")/infer.sh" "${1:-inference/resnet50}" cpu bf16 "${@:2}"
