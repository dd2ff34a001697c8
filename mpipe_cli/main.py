"""`mpipe` entry point: builds the argument parser from one module per command group.

Each command module has `register(subparsers)`; a handler takes the parsed
arguments and returns an exit code.  Errors a user caused (`MpipeError`) print
one line on stderr and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from mpipe_core.errors import MpipeError

# Imported lazily by name so `mpipe eval` never pays for torch or SQLAlchemy;
# with the top-level commands each registers, so that a command builds only
# its own module's parsers (argparse's help strings cost a gettext look-up
# each: building all of them was a tenth of `mpipe eval`'s start-up).
COMMAND_MODULES = {
    "mpipe_cli.core_commands": ("eval", "export", "import-csv", "compare", "terms"),
    "mpipe_cli.tune_commands": ("tune",),
    "mpipe_cli.plan_commands": ("plan",),
    "mpipe_cli.storage_commands": ("db", "library", "runs"),
    "mpipe_cli.executor_commands": ("run",),
    "mpipe_cli.profile_commands": ("profile",),
    "mpipe_cli.worker_commands": ("worker", "calibrate", "compare-run"),
    "mpipe_cli.app_commands": ("app",),
    "mpipe_cli.models_commands": ("models",),
    "mpipe_cli.audit_commands": ("audit",),
    "mpipe_cli.trace_commands": ("import-trace",),
    "mpipe_cli.data_commands": ("data",),
}

USER_ERROR = 2

# Commands that only simulate.  numpy does no linear algebra for them, yet
# OpenBLAS starts a spinning thread per core when numpy is imported: about a
# fifth of `mpipe eval`'s CPU time.  Commands that start ranks or the app keep
# the user's setting (the variable would reach their processes).
SIMULATION_ONLY = ("eval", "export", "import-csv", "compare", "terms", "tune", "plan")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors exit 2 too
        self.print_usage(sys.stderr)
        self.exit(USER_ERROR, f"error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with a known `command`, only the module that registers it."""
    parser = _Parser(prog="mpipe", description="Design, simulate and run pipeline-parallel training schedules for multimodal LLMs.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    mine = [name for name, commands in COMMAND_MODULES.items() if command in commands]
    for name in mine or COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if argv is None and words and words[0] in SIMULATION_ONLY:  # a process of its own, numpy not yet imported
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # (anything else, `--help` included, gets every command, and argparse's own messages)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MpipeError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
