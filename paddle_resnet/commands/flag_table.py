"""The README's flag table, generated from the config keys (``python -m
paddle_resnet.commands.flag_table``; a test says when the README's copy is stale)."""

from paddle_resnet.core.cli import flag_table_markdown
from paddle_resnet.data import records
from paddle_resnet.deploy import backends

# The keys whose values a registry above core/ holds.
REGISTRY_CHOICES = {"data.format": records.DATA_FORMATS, "inference.backend": backends.CHOICES}


def table():
    return flag_table_markdown(REGISTRY_CHOICES)


if __name__ == "__main__":
    print(table(), end="")
