#!/usr/bin/env bash
# ResNet-50 v1.5, NVIDIA MXNet recipe (step LR), 90 epochs, AMP, 8 GPUs; RecordIO input: set IMAGE_ROOT to the record folder.
exec bash "$(dirname "$0")/launch.sh" resnet50_mxnet_90e 8 AMP --data-format recordio "$@"
