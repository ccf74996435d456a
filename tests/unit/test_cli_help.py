"""Every ``toolfleet`` command's --help has examples of itself, and every option and argument
says what it is for (docs/cli.md). Parsers only: no command runs."""

from __future__ import annotations

import argparse

import pytest

from toolfleet.cli import _COMMANDS, build_parser


def _command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_every_command_is_registered() -> None:
    assert sorted(_command_parsers()) == sorted(_COMMANDS)


@pytest.mark.parametrize("command", sorted(_COMMANDS))
def test_every_command_has_examples_and_every_option_its_help(command: str) -> None:
    parser = _command_parsers()[command]
    shown = parser.format_help()
    assert "Examples:" in shown or "examples:" in shown, f"toolfleet {command} --help"
    assert f"toolfleet {command}" in shown.split("xamples:", 1)[1]
    silent = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert not silent, f"toolfleet {command}: no help text for {silent}"
