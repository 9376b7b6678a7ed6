"""docs/flags.md's table of every flag, generated from the config keys (``python -m
paddle_resnet.commands.flag_table``; a test says when the copy there is stale)."""

from paddle_resnet.commands import REGISTRY_CHOICES
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import flag_table_markdown


def table():
    return flag_table_markdown(REGISTRY_CHOICES)


if __name__ == "__main__":
    bootstrap.prepare_process()
    print(table(), end="")
