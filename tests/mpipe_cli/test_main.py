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


def test_export_torchtitan_applies_parallel_as_json_does(tmp_path, capsys):
    argv = ["export", "1f1b(p=2, m=4)", "-w", "internvl-26b", "--parallel", "tp=5"]
    assert cli.main([*argv, "--format", "json"]) == 2
    refused = capsys.readouterr()
    assert refused.out == "" and refused.err.count("\n") == 1 and "does not divide" in refused.err
    folder = tmp_path / "tt"
    assert cli.main([*argv, "--format", "torchtitan", "-o", str(folder)]) == 2
    assert capsys.readouterr().err == refused.err
    assert not folder.exists()


def test_export_offers_the_core_s_formats():
    from mpipe_core.formats.export import FORMATS, LAUNCH_FORMATS, STACK_FORMATS

    parser = cli.build_parser("export")
    export = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["export"]
    assert next(a for a in export._actions if a.dest == "format").choices == [*FORMATS, *STACK_FORMATS, *LAUNCH_FORMATS]


@pytest.mark.parametrize("value", ["\u0663", "-\u0663", "\uff13", "--3", "3\u0663"])
def test_parallel_values_are_ascii_integers(value):
    from mpipe_cli.arg_types import parallel_spec

    with pytest.raises(argparse.ArgumentTypeError, match=f"tp: expected an integer, true or false, got {value!r}"):
        parallel_spec(f"tp={value}")
    assert parallel_spec("tp=3,dp=-1,sp") == {"tp": 3, "dp": -1, "sp": True}


def test_app_refuses_a_bad_models_file_before_creating_the_database(tmp_path, capsys, no_ambient_db):
    db_file = tmp_path / "new.db"
    assert cli.main(["app", "--db", str(db_file), "--no-worker", "--models", str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "model allow-list" in err
    assert not db_file.exists()
