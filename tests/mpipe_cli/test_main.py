"""The entry point builds one command's parsers only, and the table that says
which module registers which command stays true."""
import argparse
import importlib

import pytest

from mpipe_cli import main as cli


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    return next(set(a.choices) for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.mark.parametrize("module", sorted(cli.COMMAND_MODULES))
def test_each_module_registers_exactly_the_commands_the_table_names(module):
    parser = argparse.ArgumentParser()
    importlib.import_module(module).register(parser.add_subparsers())
    assert _commands(parser) == set(cli.COMMAND_MODULES[module])


def test_a_known_command_builds_only_its_module_and_anything_else_builds_all():
    assert _commands(cli.build_parser("tune")) == {"tune"}
    assert _commands(cli.build_parser("eval")) == {"eval", "export", "import-csv", "compare", "terms"}
    every = {c for commands in cli.COMMAND_MODULES.values() for c in commands}
    assert _commands(cli.build_parser(None)) == every
    assert _commands(cli.build_parser("--help")) == every


def test_an_unknown_command_still_gets_argparse_s_list_of_choices(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["evl", "1f1b(p=2, m=2)"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'evl'" in err and "'library'" in err and "'eval'" in err
