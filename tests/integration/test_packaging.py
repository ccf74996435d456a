"""One import namespace: the wheel installs ``toolfleet`` alone, a worker process loads no
dispatcher module, and nothing in a user's working directory shadows toolfleet."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import toolfleet
from tests.support.cli_support import REPO_ROOT, killed_on_exit, toolfleet_argv
from tests.support.fleet import call, run
from tests.support.waiting import until
from toolfleet.broker.lua_scripts import lua_names
from toolfleet.dispatcher import Branch, Fleet
from toolfleet.schemas.settings import Settings

pytestmark = pytest.mark.slow


def test_the_public_face_names_resolve_and_match_all() -> None:
    for name in toolfleet.__all__:
        assert getattr(toolfleet, name) is not None, name
    assert set(toolfleet.__all__) == set(toolfleet._HOMES)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = toolfleet.nope  # type: ignore[attr-defined]


def test_the_wheel_installs_toolfleet_alone(tmp_path: Path) -> None:
    # Built from a copy: pip builds in the source tree, which must stay clean (no build/).
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT, source, symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".toolfleet"
        ),
    )  # fmt: skip
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("toolfleet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"toolfleet"}, sorted(top)
    for module in (
        "toolfleet/__init__.py",
        "toolfleet/schemas/keys.py",
        "toolfleet/dispatcher/batch/act.py",
        "toolfleet/workers/app.py",
        "toolfleet/cli/__init__.py",
        "toolfleet/adapters/mcp.py",
        "toolfleet/py.typed",
    ):
        assert module in names, module
    # Every Lua script ships, read where toolfleet.broker.lua_scripts looks for it.
    shipped = {n.removeprefix("toolfleet/broker/lua/") for n in names if n.endswith(".lua")}
    assert len(shipped) >= 10
    assert shipped == {f"{name}.lua" for name in lua_names()}, sorted(shipped)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "toolfleet = toolfleet.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.usefixtures("sync_worker", "async_worker")
def test_a_worker_process_loads_no_dispatcher_module(fleet_settings: Settings) -> None:
    async def scenario(fleet: Fleet) -> list[object]:
        branch = Branch(fleet=fleet)
        results = await branch.act(
            [
                call("loaded_modules", prefix="toolfleet.dispatcher"),
                call("loaded_modules_async", prefix="toolfleet.dispatcher"),
                call("loaded_modules", prefix="toolfleet.workers"),
            ]
        )
        return [r.output for r in results]

    in_prefork_child, in_async_worker, worker_modules = run(fleet_settings, scenario)
    assert in_prefork_child == [] and in_async_worker == []
    assert "toolfleet.workers.app" in worker_modules  # the probe does see what is loaded


SHADOWS = {
    "schemas.py": "raise ImportError('the user\\'s own schemas.py was imported')\n",
    "dispatcher.py": "raise ImportError('the user\\'s own dispatcher.py was imported')\n",
    "workers/__init__.py": "raise ImportError('the user\\'s own workers/ was imported')\n",
    "usertools.py": textwrap.dedent(
        """
        from toolfleet import tool

        @tool
        def shout(text: str) -> str:
            return text.upper()
        """
    ),
}


@pytest.fixture()
def user_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    for name, text in SHADOWS.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    return project


def _user_env(home: Path, **extra: str) -> dict[str, str]:
    # A user's shell: no PYTHONPATH pointing at the checkout, no TOOLFLEET_* settings.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TOOLFLEET_") and k not in {"PYTHONPATH", "COLUMNS"}
    }
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def test_demo_and_run_from_a_directory_that_holds_schemas_dispatcher_and_workers(
    user_project: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _user_env(home)
    demo = subprocess.run(
        toolfleet_argv("demo", "--async-calls", "2", "--sync-calls", "1"),
        cwd=user_project, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "was imported" not in demo.stdout + demo.stderr

    (user_project / "calls.jsonl").write_text(
        '{"function": "shout", "arguments": {"text": "hi"}}\n'
    )
    ran = subprocess.run(
        toolfleet_argv("run", "calls.jsonl", "--tools", "usertools", "--output", "out.jsonl"),
        cwd=user_project, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert '"HI"' in (user_project / "out.jsonl").read_text()


def test_worker_and_act_from_a_directory_that_holds_schemas_dispatcher_and_workers(
    user_project: Path, tmp_path: Path, redis_url: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    # Queues of its own: the session's shared workers (which lack this tool) must not take
    # its call.
    queue = f"shadow-{os.getpid()}"
    env = _user_env(
        home,
        TOOLFLEET_BROKER_URL=redis_url,
        TOOLFLEET_SYNC_QUEUE=f"{queue}.sync",
        TOOLFLEET_ASYNC_QUEUE=f"{queue}.async",
    )
    (user_project / "agent.py").write_text(
        textwrap.dedent(
            """
            import usertools  # noqa: F401  (the dispatcher knows the tools it sends)
            from toolfleet import Branch, Fleet

            fleet = Fleet.from_env()
            [result] = Branch(fleet=fleet).act_sync(
                {"function": "shout", "arguments": {"text": "hello"}}
            )
            print("OUTPUT", result.output)
            """
        )
    )
    worker = subprocess.Popen(
        toolfleet_argv("worker", "--kind", "sync", "--concurrency", "1", "--tools", "usertools",
                       "--hostname", f"shadow-{os.getpid()}@localhost"),
        cwd=user_project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    with killed_on_exit(worker):
        agent = subprocess.run(
            [sys.executable, "agent.py"],
            cwd=user_project, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stdout + agent.stderr
        assert "OUTPUT HELLO" in agent.stdout
        assert worker.poll() is None
    until(lambda: worker.poll() is not None, timeout_s=30, what="the worker to stop")
    assert "was imported" not in (worker.stdout.read() if worker.stdout else "")
