"""``toolfleet tools``: print the registry's tool specs for a model (OpenAI, Anthropic, MCP).

Needs no broker: it only imports the tool modules and reads their signatures.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from toolfleet.cli.tool_modules import add_tools_option, load_tool_modules, tool_modules
from toolfleet.schemas.errors import ConfigurationError
from toolfleet.workers.registry import registry
from toolfleet.workers.specs import SPEC_FORMATS

__all__ = ["register"]

_EPILOG = """\
Examples:
  toolfleet tools --tools mytools
  toolfleet tools --tools mytools --format anthropic > tools.json
  TOOLFLEET_TOOLS=mytools toolfleet tools --format mcp --name fetch --name divide

Prints one JSON list: pass it as `tools=` to the OpenAI or Anthropic SDK, or serve it as an
MCP server's tools/list. Exit codes: 0 printed; 2 no tool module, a module that does not
import, an unknown --name or --format.
"""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add ``toolfleet tools`` to the ``toolfleet`` parser."""
    tools = subparsers.add_parser(
        "tools",
        help="print the tool specs a model needs (openai, anthropic or mcp JSON)",
        description="Import the tool modules and print each tool's definition — name, "
        "docstring description, JSON Schema of its arguments — in a provider's format.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_tools_option(tools)
    tools.add_argument(
        "--format",
        choices=SPEC_FORMATS,
        default="openai",
        help="openai (Chat Completions, default), openai-responses, anthropic or mcp",
    )
    tools.add_argument(
        "--name",
        action="append",
        metavar="TOOL",
        default=None,
        help="only this tool (repeatable); default: every registered tool, sorted by name",
    )
    tools.add_argument("--indent", type=int, default=2, help="JSON indent (0: one line)")
    tools.set_defaults(func=_tools)


def _tools(args: argparse.Namespace) -> int:
    # TOOLFLEET_TOOLS as written, not Settings: this command reads no other setting.
    load_tool_modules(tool_modules([os.environ.get("TOOLFLEET_TOOLS", "")], args.tools))
    try:
        specs = registry.specs(args.format, names=args.name)
    except LookupError as exc:
        raise ConfigurationError(str(exc)) from None
    print(json.dumps(specs, indent=args.indent or None))
    return 0
