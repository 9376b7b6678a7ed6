"""What every entry point does with its command line: flags -> Config -> action."""
import sys

from paddle_resnet.config import build_parser, config_from_args, list_recipes, parse_bool, to_yaml
from paddle_resnet.errors import UserError


def main_with(description, action, argv=None, inference=False):
    """Parse ``argv`` into the Config and run ``action(config)``; returns the exit code.

    --list-configs and --show-config answer and stop; bad input (UserError) and a
    file that cannot be written or read (OSError: read-only, full disk, a folder where
    a file should be) become one ``error: ...`` line on stderr and exit code 2.
    """
    args = build_parser(description, inference=inference).parse_args(argv)
    try:
        if getattr(args, "list_configs", False):
            print("\n".join(list_recipes()))
            return 0
        config = config_from_args(args)
        show = getattr(args, "show_config", None)
        if show is not None and (show == "exit" or parse_bool(show, "--show-config")):
            print(to_yaml(config), end="")
            if show == "exit":
                return 0
        action(config)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    return 0
