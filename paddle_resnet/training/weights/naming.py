"""Which of a model family's weight namings a file of another framework uses.

Each family declares, beside its network, how every source of pretrained weights it
imports from (torchvision/timm, PaddleClas, ...) names its tensors
(``models.family.WeightNaming``). A file's naming is the one that names the most of its
tensors.
"""

from paddle_resnet.core.errors import CheckpointError


def recognise(state, structured, entry, source):
    """(the ``WeightNaming`` of the file whose tensors are ``state``, {file name: our
    structured name}) for the model ``entry``; ``structured`` is our structured names."""
    namings = entry.family.weight_namings
    tables = [
        (naming, {naming.rename(ours, entry.spec): ours for ours in structured})
        for naming in namings
    ]
    naming, expected = max(
        tables, key=lambda table: len(set(table[1]) & set(state)), default=(None, {})
    )
    if not set(expected) & set(state):
        known = ", ".join(n.name for n in namings) or f"the {entry.family.name} sources (none)"
        raise CheckpointError(
            f"{source}: unknown naming: tensor {next(iter(state))!r} is named "
            f"as in none of {known} (nor as in this toolkit's files)"
        )
    return naming, expected
