"""The PDS write budget, through a proxy in front of the real PDS that plays a rate-limited
PDS: a 429 with ``ratelimit-reset`` on a final write waits for the reset and writes then
(the reply never stays streaming, the model is asked once); while the PDS reports fewer
points than ``[replies] reserve_points`` no progress update is spent; near a relay's
per-host event limits (``[relay]``) progress updates are spaced out, then stopped."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of
from .rate_limit_proxy import RateLimitProxy

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def final_write(path: str, body: bytes) -> bool:
    return "putRecord" in path and b'"status":"complete"' in body


async def test_a_rate_limited_final_write_waits_for_the_reset_and_lands(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    refused_once = {"n": 0}

    def refuse(path: str, body: bytes) -> bool:
        if final_write(path, body) and refused_once["n"] == 0:
            refused_once["n"] += 1
            return True
        return False

    proxy = await RateLimitProxy(dev_pds.pds_url, refuse, reset_in=4).start()
    try:
        settings = make_settings(proxy.url, pds_account, tmp_path / "state", model_server.url,
                                 watch={"source": "poll", "poll_interval": 0.3})
        async with running_worker(settings, pds_account, keyring[0]) as worker:
            model_server.enqueue(Turn(text="worth the wait"))
            k = await app.send("hello", conversation=new_tid())
            rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
            landed = time.time()
            await worker.wait_idle(10)
    finally:
        await proxy.stop()
    assert len(proxy.refused) == 1 and landed - proxy.refused[0] >= 3
    assert text_of(content) == "worth the wait" and len(model_server.requests) == 1


async def test_no_progress_update_is_spent_while_the_budget_is_low(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    writes: dict[str, list[bytes]] = {"streaming": []}

    def watch(path: str, body: bytes) -> bool:
        if "putRecord" in path and b'"status":"streaming"' in body:
            writes["streaming"].append(body)
        return False

    counts = {}
    for remaining in (4000, 20):
        writes["streaming"].clear()
        # the window resets in an hour: a reset seen during the turn would (rightly) lift the limit
        proxy = await RateLimitProxy(dev_pds.pds_url, watch, remaining=remaining, reset_in=3600).start()
        try:
            settings = make_settings(proxy.url, pds_account, tmp_path / f"state-{remaining}", model_server.url,
                                     watch={"source": "poll", "poll_interval": 0.3},
                                     replies={"update_interval": 0.2, "reserve_points": 100})
            async with running_worker(settings, pds_account, keyring[0]) as worker:
                model_server.enqueue(Turn(text="slow words " * 20, chunk_size=5, chunk_delay=0.05))
                k = await app.send("talk slowly", conversation=new_tid())
                await app.wait_status(f"{k}.r0", "complete", timeout=60)
                await worker.wait_idle(10)
        finally:
            await proxy.stop()
        counts[remaining] = len(writes["streaming"])
    assert counts[4000] > 0 and counts[20] == 0, counts


async def test_relay_host_limits_space_out_then_stop_progress_updates_and_the_reply_completes(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    """``[relay] limits = "on"`` with 10 events an hour for the host: the claim and the
    first progress updates go out, they are spaced out from 5 events on and stop at 8;
    the final write still lands. With the limits off the same reply spends many more."""
    streaming: list[bytes] = []

    def watch(path: str, body: bytes) -> bool:
        if "putRecord" in path and b'"status":"streaming"' in body:
            streaming.append(body)
        return False

    counts: dict[str, int] = {}
    for limits in ("off", "on"):
        streaming.clear()
        proxy = await RateLimitProxy(dev_pds.pds_url, watch, remaining=4900, reset_in=3600).start()
        try:
            settings = make_settings(proxy.url, pds_account, tmp_path / f"state-{limits}", model_server.url,
                                     watch={"source": "poll", "poll_interval": 0.3},
                                     replies={"update_interval": 0.1},
                                     relay={"limits": limits, "events_per_hour": 10})
            async with running_worker(settings, pds_account, keyring[0]) as worker:
                model_server.enqueue(Turn(text="slow words " * 40, chunk_size=5, chunk_delay=0.05))
                k = await app.send("talk slowly", conversation=new_tid())
                _rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
                await worker.wait_idle(10)
                relay = worker.pds.relay
        finally:
            await proxy.stop()
        assert text_of(content).split() == ["slow", "words"] * 40
        counts[limits] = len(streaming)
        if limits == "on":
            assert relay is not None
            # claim + progress + final: the progress stopped at 80 % of the hour's 10 events
            assert relay.counts()["hour"] == 1 + counts["on"] + 1
            assert 1 + counts["on"] <= 8
        else:
            assert relay is None  # a loopback PDS: no relay crawls it
    assert counts["off"] > 10 and 0 < counts["on"] <= 7, counts
