"""The command-line arguments every command that reads a run config shares: the config, in
any shape a user holds, and `--set` overrides."""

from __future__ import annotations

import argparse
import sys

from rlcore.config.files import read_run_config

CONFIG_HELP = "run config (YAML or JSON), a pipeline config (its run: section) or a run directory"


def add_config(parser: argparse.ArgumentParser) -> None:
    """The positional CONFIG argument."""
    parser.add_argument("config", help=CONFIG_HELP)


def add_overrides(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE`, repeatable: `args.set`, a list."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.updates=10 (repeatable)")


def say_which_part_runs(path: str) -> None:
    """A line on stderr when the config file is not a plain run config (a pipeline config, a
    run's record): what of it is used."""
    note = read_run_config(path)[1]
    if note:
        print(f"rlcore: {note}", file=sys.stderr)
