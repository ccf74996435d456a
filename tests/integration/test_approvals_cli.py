"""``toolfleet approvals`` never cuts an id; ``approve``/``deny`` take any unique prefix of one
(at least four characters, as git takes commit ids) and refuse one that several waiting calls
share, naming them. Real workers, real Redis, the command in subprocesses."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import uuid
from pathlib import Path

from tests.support.approvals import parked, ran, refund
from tests.support.cli_support import toolfleet
from tests.support.fleet import private_workers, run
from toolfleet import Branch, Fleet
from toolfleet.dispatcher.accept.context import call_id_for
from toolfleet.schemas.settings import Settings

TOOLS = ("tests.support.approval_tools",)


def _two_sharing_a_prefix(branch_id: str, length: int) -> tuple[str, str, str]:
    """Two model ids whose call ids in ``branch_id`` start alike for ``length`` characters,
    and a third whose call id starts otherwise (call ids derive from the model's ids)."""
    seen: dict[str, str] = {}
    for n in itertools.count():
        tool_call_id = f"call_{n}"
        start = call_id_for(branch_id, tool_call_id)[:length]
        if start in seen:
            first, second = seen[start], tool_call_id
            break
        seen[start] = tool_call_id
    third = next(
        f"other_{n}"
        for n in itertools.count()
        if call_id_for(branch_id, f"other_{n}")[:length] != start
    )
    return first, second, third


def test_prefixes_decide_calls_and_an_ambiguous_one_names_the_candidates(
    redis_url: str, tmp_path: Path
) -> None:
    side = tmp_path / "side"
    branch_id = str(uuid.uuid4())
    model_ids = _two_sharing_a_prefix(branch_id, 4)
    twin_a, twin_b, other = (call_id_for(branch_id, m) for m in model_ids)
    batch = [{**refund(side, token), "id": m} for token, m in enumerate(model_ids, start=1)]

    with private_workers(redis_url, "approvals-cli", tools=TOOLS) as env:
        settings = Settings.from_env(env, tools=TOOLS)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            # Narrower than the usual 80 columns: ids must still come out whole.
            return toolfleet(*args, home=tmp_path, env={**env, "COLUMNS": "60"}, timeout_s=60)

        async def scenario(fleet: Fleet) -> None:
            acting = asyncio.create_task(Branch(fleet=fleet, id=branch_id).act(batch))
            await parked(fleet, 3)
            listing = await asyncio.to_thread(cli, "approvals")
            assert listing.returncode == 0, listing.stderr
            for call_id in (twin_a, twin_b, other):
                assert call_id in listing.stdout, listing.stdout
            assert "…" not in listing.stdout

            shared = twin_a[:4]
            ambiguous = await asyncio.to_thread(cli, "approve", shared)
            assert ambiguous.returncode == 2, ambiguous.stderr
            assert twin_a in ambiguous.stderr and twin_b in ambiguous.stderr
            assert "give more of the id" in ambiguous.stderr

            for args, call_id in (
                (("approve", twin_a[:13], "--by", "alice"), twin_a),
                (("deny", twin_b, "--reason", "no"), twin_b),
                (("approve", other[:6]), other),
            ):
                done = await asyncio.to_thread(cli, *args)
                assert done.returncode == 0, done.stderr
                assert f"call {call_id} (refund)" in done.stdout
            results = await asyncio.wait_for(acting, 30)
            assert [r.status.value for r in results] == ["completed", "skipped", "completed"]

            # Too short to be a prefix: it names no call, and says so.
            short = await asyncio.to_thread(cli, "approve", twin_a[:3])
            assert short.returncode == 1 and "is waiting for approval" in short.stderr

        run(settings, scenario, timeout_s=90)
    assert sorted(ran(side)) == [("refund", 1), ("refund", 3)]
