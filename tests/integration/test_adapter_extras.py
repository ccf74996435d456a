"""Importing an adapter whose framework (an optional extra) is missing is one line naming the
extra to install, the same for every adapter: each import runs in a fresh interpreter where
the framework's package is blocked (``sys.modules[name] = None``, as if never installed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_support import REPO_ROOT, cli_env

# adapter module -> (the packages of its framework, the extra that installs them)
ADAPTERS = {
    "toolfleet.adapters.langgraph": (("langchain_core", "langgraph"), "langgraph"),
    "toolfleet.adapters.pydantic_ai": (("pydantic_ai",), "pydantic-ai"),
    "toolfleet.adapters.openai_agents": (("agents",), "openai-agents"),
    "toolfleet.adapters.openai_agents_tools": (("agents",), "openai-agents"),
    "toolfleet.adapters.mcp": (("mcp", "mcp_types"), "mcp"),
}

_PROBE = """
import json, sys
for name in json.loads(sys.argv[2]):
    sys.modules[name] = None  # import of it fails as for a package never installed
try:
    __import__(sys.argv[1])
except Exception as exc:
    print(json.dumps({"type": [c.__name__ for c in type(exc).__mro__], "text": str(exc)}))
else:
    print(json.dumps(None))
"""


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_an_adapter_without_its_extra_says_which_extra_to_install(
    module: str, tmp_path: Path
) -> None:
    packages, extra = ADAPTERS[module]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, module, json.dumps(packages)],
        cwd=REPO_ROOT,
        env=cli_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found is not None, f"{module} imported with {packages} missing"
    assert "ConfigurationError" in found["type"]
    # One line, one form for every adapter: what is missing, why, the command that fixes it.
    shape = rf"[\w ]+ is not installed \(.*{packages[0]}.*\); pip install 'toolfleet\[{extra}\]'"
    assert re.fullmatch(shape, found["text"]), found["text"]
