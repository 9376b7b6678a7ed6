"""Which of a model family's weight namings a file of another framework uses.

Each family declares how every source it imports from names its tensors
(``models.family.WeightNaming``); a file's is the one that names the most of them.
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
