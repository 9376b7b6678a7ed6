"""docs/flags.md's table of every flag, generated from the config keys (``python -m
paddle_resnet.commands.flag_table``; a test says when the copy there is stale)."""

from paddle_resnet.commands import registry_choices
from paddle_resnet.core import bootstrap
from paddle_resnet.core.cli import flag_table_markdown


def table():
    return flag_table_markdown(registry_choices())


if __name__ == "__main__":
    bootstrap.prepare_process()
    print(table(), end="")
