"""Prompt caching on the real PDS: the second turn of an Anthropic conversation reads the
first turn's prompt from the cache (by the documented rules the local server applies),
and the turn's timing row, ``gelbridge status`` and the metrics say how much."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._observability import Metrics
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]

LONG = "Follow the house style: short sentences, plain words, no lists. " * 110  # ~1,700 tokens


async def test_second_turn_reads_the_first_from_the_cache(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(
        dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
        defaults={"model": {"provider": "claude", "id": "claude-sonnet-4-6"}, "instructions": LONG},
        providers={"claude": {"adapter": "anthropic", "base_url": model_server.url, "max_retries": 0}},
        observability={"listen": "127.0.0.1:0"},
    )
    conv = new_tid()
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        assert isinstance(worker.metrics, Metrics)  # [observability] listen is set
        model_server.enqueue(Turn(text="First."), Turn(text="Second."))
        k0 = await app.send("one", conversation=conv)
        await app.wait_status(f"{k0}.r0", "complete")
        k1 = await app.send("two", conversation=conv, parent=f"{k0}.r0")
        await app.wait_status(f"{k1}.r0", "complete")
        await worker.wait_idle(10)
        second, first = await worker.store.recent_turns(2, account=app.did)
        exposition = worker.metrics.exposition().decode()
    assert first.cached_tokens == 0 and first.cache_write_tokens == first.input_tokens
    assert second.input_tokens is not None and second.cached_tokens is not None
    assert second.cached_tokens == first.input_tokens and second.cached_tokens / second.input_tokens > 0.8
    read = f'gelbridge_model_input_tokens_total{{account="{worker.label}",kind="cache_read"}} {second.cached_tokens}.0'
    assert read in exposition, [line for line in exposition.splitlines() if "input_tokens" in line]
