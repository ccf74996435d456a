"""The Lua scripts are files of toolfleet/broker/lua/, each loaded by exactly one name in the
code, and no Python module carries one as a string (docs/layout.md, "Lua scripts")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from toolfleet.broker.client_settings import ClientSettings, client_settings
from toolfleet.broker.lua_scripts import lua_names, lua_script, lua_source
from toolfleet.broker.redis_url import replica_acks_of, require_replica_acks
from toolfleet.schemas.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "toolfleet" / "broker" / "lua"
# Where toolfleet's Python lives in the checkout (toolfleet/ links to the other three).
SOURCES = [
    ROOT / "schemas",
    ROOT / "dispatcher",
    ROOT / "workers",
    ROOT / "toolfleet",
    ROOT / "bench",
]
LOADER = ROOT / "toolfleet" / "broker" / "lua_scripts.py"
_LOADED = re.compile(r"\blua_(?:script|source)\(\s*([^)]*)\)")


def _python_files() -> list[Path]:
    found: list[Path] = []
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            # toolfleet/schemas and the like link to the folders above: each file once.
            if any((ROOT / part).is_symlink() for part in path.relative_to(ROOT).parents):
                continue
            found.append(path)
    return found


def _loaded_names() -> list[tuple[str, Path]]:
    loaded: list[tuple[str, Path]] = []
    for path in _python_files():
        if path == LOADER:
            continue
        for argument in _LOADED.findall(path.read_text()):
            literal = re.fullmatch(r'"([a-z0-9_]+)"', argument.strip())
            assert literal, (
                f"{path.relative_to(ROOT)} loads a script by {argument!r}: name it as a literal"
            )
            loaded.append((literal.group(1), path))
    return loaded


def test_every_lua_file_is_loaded_by_exactly_one_name_in_the_code() -> None:
    files = sorted(p.stem for p in LUA.glob("*.lua"))
    assert len(files) >= 10
    assert sorted(lua_names()) == files
    loaded = _loaded_names()
    names = [name for name, _ in loaded]
    twice = {
        name: [str(p.relative_to(ROOT)) for n, p in loaded if n == name]
        for name in names
        if names.count(name) > 1
    }
    assert not twice, f"each script is loaded in one place: {twice}"
    assert not set(names) - set(files), f"no file for {sorted(set(names) - set(files))}"
    assert not set(files) - set(names), f"never loaded: {sorted(set(files) - set(names))}"


def test_no_python_module_carries_a_lua_script_as_a_string() -> None:
    carriers = [
        str(path.relative_to(ROOT)) for path in _python_files() if "redis.call(" in path.read_text()
    ]
    assert not carriers, f"Lua belongs in toolfleet/broker/lua/*.lua, not in {carriers}"


@pytest.mark.parametrize("name", sorted(lua_names()))
def test_each_script_is_headed_by_what_it_does_its_keys_and_argv(name: str) -> None:
    lines = lua_source(name).splitlines()
    body = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    header = " ".join(lines[:body])
    assert header.startswith("-- "), name
    assert "KEYS[1]" in header, f"{name}.lua: its header names no KEYS"
    assert "ARGV[1]" in header, f"{name}.lua: its header names no ARGV"
    assert "return" in header.lower(), f"{name}.lua: its header says not what it returns"


def test_a_script_is_read_and_hashed_once_per_process() -> None:
    assert lua_script("record_release") is lua_script("record_release")
    assert lua_source("record_release") is lua_source("record_release")


def test_an_unknown_script_name_is_refused_with_the_names_there_are() -> None:
    with pytest.raises(ConfigurationError, match=r"'record_relase'.*record_release"):
        lua_source("record_relase")


def test_a_script_runs_on_any_client_and_leaves_nothing_on_it(redis_client: redis.Redis) -> None:
    release = lua_script("record_release")
    attributes = set(vars(redis_client))
    redis_client.script_flush()
    redis_client.set("started", "ours")
    # NOSCRIPT on a server that does not know it yet: loaded, then run, as redis-py's Script does.
    assert release.run_blocking(redis_client, keys=["started"], args=["theirs"]) == 0
    assert redis_client.script_exists(release.sha) == [True]
    assert release.run_blocking(redis_client, keys=["started"], args=["ours"]) == 1
    assert redis_client.get("started") is None
    assert set(vars(redis_client)) == attributes


def test_replica_acks_are_kept_beside_a_client_not_on_it(redis_client: redis.Redis) -> None:
    attributes = set(vars(redis_client))
    assert replica_acks_of(redis_client) == 0
    assert require_replica_acks(redis_client, 2) is redis_client
    assert replica_acks_of(redis_client) == 2
    assert client_settings(redis_client) == ClientSettings(replica_acks=2)
    assert set(vars(redis_client)) == attributes
    other = redis.Redis()
    assert replica_acks_of(other) == 0
