"""The command line of each tool, generated from the config fields: flags -> Config ->
action. Each tool takes the flags of the keys it reads; a flag of another tool is refused
with one line that says whose it is (the flag table: ``commands/flag_table``)."""

import argparse
import sys
from typing import Optional

import yaml

from paddle_resnet.core.bootstrap import is_verbose, set_verbose
from paddle_resnet.core.config import (
    SECTION_TITLES,
    all_keys,
    build_config,
    config_field,
    convert_value,
    list_recipes,
    parse_bool,
    read_recipe,
    resolve_config_path,
    to_yaml,
)
from paddle_resnet.core.config.keys import TOOLS
from paddle_resnet.core.errors import ConfigError, exit_status

# The command a tool is run as, where it is not <tool>.py at the repository's root.
PROGRAMS = {"check_data": "paddle-resnet-check-data", "serve": "paddle-resnet-serve"}


def program(tool):
    return PROGRAMS.get(tool, f"{tool}.py")


def tool_reads(tool, dotted):
    """Whether ``tool`` takes the flag of config key ``dotted`` (declared on the key)."""
    return tool in config_field(dotted).metadata["tools"]


def _is_bool(f):
    return f.type in (bool, Optional[bool])


class _DeprecatedAlias(argparse.Action):
    """An old flag name that still works (a bool with or without its value, as NVIDIA's
    2022 scripts pass it: --trt-use-synthat True), with a warning naming the new one."""

    def __init__(self, option_strings, dest, replacement, is_bool, **kwargs):
        self.replacement, self.is_bool = replacement, is_bool
        super().__init__(option_strings, dest, nargs="?" if is_bool else None, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"warning: {option_string} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, True if values is None else values)


class _BoolFlag(argparse.Action):
    """``--x``, ``--no-x`` and ``--x VALUE`` (true/false, 1/0, yes/no, on/off: NVIDIA's scripts
    pass ``--use-static True``), the value checked when the Config is built."""

    def __init__(self, option_strings, dest, **kwargs):
        negatives = [f"--no-{flag[2:]}" for flag in option_strings]
        super().__init__(list(option_strings) + negatives, dest, nargs="?", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string.startswith("--no-"):
            if values is not None:
                parser.error(f"{option_string} takes no value")
            values = False
        setattr(namespace, self.dest, True if values is None else values)


class _Repeated(argparse.Action):
    """A flag that may be given again, its values adding up (``--tracker a --tracker b``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{before},{values}" if before else values)


class _OtherToolsFlag(argparse.Action):
    """A flag of a config key this tool does not read: refused, naming who reads it."""

    def __init__(self, option_strings, dest, tool, readers, **kwargs):
        self.tool, self.readers = tool, readers
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} is not used by {program(self.tool)} (it sets {self.dest}, "
            f"read by {' and '.join(map(program, self.readers))})"
        )


def image_shape_values(text):
    """NVIDIA's --image-shape C,H,W as the keys it sets: channels and the square crop."""
    try:
        channels, height, width = (int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"--image-shape {text!r}: expected C,H,W, e.g. 4,224,224") from None
    if height != width:
        raise ConfigError(f"--image-shape {text!r}: the crop is square (H = W)")
    return {"model.image_channels": channels, "data.crop_size": height}


def _choices(dotted, f, choices):
    """The values of key ``dotted``: its own, or a registry's above core/ (``choices``)."""
    return (choices or {}).get(dotted) or f.metadata["choices"]


def _help(f, values):
    listed = f": {' / '.join(map(str, values))}" if values else ""
    return f"{f.metadata['help']}{listed}"


def build_parser(tool, description=None, choices=None):
    """The command line of ``tool``: a flag per config key it reads, others refused, no
    abbreviations; ``choices``: {dotted key: values} of registries above core/."""
    parser = argparse.ArgumentParser(
        prog=program(tool),
        description=description,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config", help="YAML recipe: a path or a name in configs/ (see --list-configs)"
    )
    parser.add_argument("--list-configs", action="store_true", help="list the recipes and exit")
    parser.add_argument(
        "--show-config",
        nargs="?",
        const="exit",
        metavar="BOOL",
        help="print the resolved configuration as YAML and exit; with a value "
        "(NVIDIA's --show-config True) print it and go on",
    )
    if tool_reads(tool, "model.image_channels"):
        parser.add_argument(
            "--image-shape",
            metavar="C,H,W",
            help="NVIDIA's input shape, e.g. 4,224,224: sets --image-channels and --crop-size",
        )
    parser.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="set any config key, e.g. --set data.num_threads=2 (repeatable)",
    )
    groups = {}
    for dotted, f in all_keys():
        meta = f.metadata
        flags = (meta["flag"],) + meta["aliases"] + meta["deprecated"]
        if not tool_reads(tool, dotted):
            readers = [t for t in TOOLS if tool_reads(t, dotted)]
            parser.add_argument(
                *flags, dest=dotted, action=_OtherToolsFlag, tool=tool, readers=readers
            )
            continue
        section = dotted.partition(".")[0]
        if section not in groups:
            groups[section] = parser.add_argument_group(SECTION_TITLES[section])
        group = groups[section]
        values = _choices(dotted, f, choices)
        text = f"{_help(f, values)} [{dotted}, default {f.default}]"
        names = (meta["flag"],) + meta["aliases"]
        if _is_bool(f):
            group.add_argument(*names, dest=dotted, action=_BoolFlag, metavar="BOOL", help=text)
        else:
            group.add_argument(
                *names,
                dest=dotted,
                action=_Repeated if meta["repeatable"] else "store",
                metavar=dotted.split(".")[1].upper(),
                choices=values if dotted in (choices or {}) else None,
                help=text,
            )
        for old in meta["deprecated"]:
            group.add_argument(
                old,
                dest=dotted,
                action=_DeprecatedAlias,
                help=argparse.SUPPRESS,
                replacement=meta["flag"],
                is_bool=_is_bool(f),
            )
    return parser


def config_from_args(namespace):
    """Defaults < recipe < --set < flags, as a validated Config."""
    given = vars(namespace)
    values = read_recipe(resolve_config_path(given["config"])) if given.get("config") else {}
    shape = image_shape_values(given["image_shape"]) if given.get("image_shape") else {}
    values.update(shape)
    for assignment in given.get("set") or []:
        dotted, sep, raw = assignment.partition("=")
        if not sep:
            raise ConfigError(f"--set {assignment!r}: expected SECTION.KEY=VALUE")
        config_field(dotted, "--set")
        values[dotted] = convert_value(dotted, yaml.safe_load(raw) if raw else None, "--set")
    flags = {
        dotted: convert_value(dotted, raw, config_field(dotted).metadata["flag"])
        for dotted, raw in given.items()
        if "." in dotted
    }
    for dotted, value in shape.items():
        if dotted in flags and flags[dotted] != value:
            flag = config_field(dotted).metadata["flag"]
            raise ConfigError(
                f"--image-shape {given['image_shape']} sets {flag} {value}, "
                f"but {flag} {flags[dotted]} is given too"
            )
    values.update(flags)
    return build_config(values)


def parse(tool, argv):
    """The Config of ``tool``'s command line ``argv`` (tests and scripts build it so)."""
    return config_from_args(build_parser(tool).parse_args(argv))


def flag_table_markdown(choices=None):
    """The flag table (docs/flags.md), with the tools that take each flag."""
    short = {"export_model": "export", "inference": "infer", "check_data": "check-data"}
    lines = ["| flag | config key | default | tools | meaning |", "|---|---|---|---|---|"]
    section = None
    for dotted, f in all_keys():
        if dotted.partition(".")[0] != section:
            section = dotted.partition(".")[0]
            lines.append(f"| **{SECTION_TITLES[section]}** | | | | |")
        meta = f.metadata
        names = ", ".join(f"`{flag}`" for flag in (meta["flag"],) + meta["aliases"])
        if meta["deprecated"]:
            names += " (deprecated: " + ", ".join(f"`{flag}`" for flag in meta["deprecated"]) + ")"
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        tools = ", ".join(short.get(t, t) for t in TOOLS if tool_reads(t, dotted))
        values = _choices(dotted, f, choices)
        lines.append(f"| {names} | `{dotted}` | {default} | {tools} | {_help(f, values)} |")
    return "\n".join(lines) + "\n"


def main_with(tool, description, action, argv=None, choices=None):
    """Parse ``argv`` into the Config of ``tool`` and run ``action(config)``; returns the
    exit status (``errors.exit_status``: the int ``action`` returns, else 0). --list-configs
    and --show-config answer and stop."""
    args = build_parser(tool, description, choices).parse_args(argv)
    # A file name that is not UTF-8 (os.listdir escapes its bytes as surrogates) prints
    # as \udcxx escapes, as Python prints it on stderr, instead of ending the tool.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")

    def run():
        if getattr(args, "list_configs", False):
            print("\n".join(list_recipes()))
            return
        config = config_from_args(args)
        set_verbose(config.run.verbose or is_verbose(argv=[]))  # or the environment's
        show = getattr(args, "show_config", None)
        if show is not None and (show == "exit" or parse_bool(show, "--show-config")):
            print(to_yaml(config), end="")
            if show == "exit":
                return
        return action(config)

    return exit_status(run)
