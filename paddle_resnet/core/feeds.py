"""The names of what is fed: the keys of the batches the data pipelines yield, the
programs' input variables, and the exported model's input (NVIDIA's names)."""

IMAGE = "data"
LABEL = "label"
MIXUP_LAMBDA = "mixup_lambda"
CLASS_WEIGHTS = "class_weights"
LOGIT_OFFSETS = "logit_offsets"
