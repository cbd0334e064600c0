"""Crash, restart and cursor behaviour of `gelbridge run` as a real subprocess."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring
from gelbridge._state import SqliteStore

from .conftest import App, text_of
from .worker_proc import WorkerProc, write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]


async def test_worker_killed_mid_stream_is_restarted_and_leaves_one_complete_reply(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    model_server.enqueue(Turn(text="slow " * 200, chunk_size=5, chunk_delay=0.05))  # ~10 s of streaming
    w1 = WorkerProc(cfg, pds_account, tmp_path / "w1.log")
    procs.append(w1)
    await asyncio.to_thread(w1.start)
    conv = new_tid()
    k = await app.send("tell me slowly", conversation=conv)
    rec, content = await app.wait_status(f"{k}.r0", "streaming", timeout=30, interval=0.05)
    assert content is not None and text_of(content).startswith("slow")
    w1.kill()
    rec, _ = await app.wait_status(f"{k}.r0", "streaming", timeout=2)  # left unfinished by the crash
    with SqliteStore.open_dir(tmp_path / "state") as store:
        assert [c.reply_rkey for c in await store.unfinished_claims(app.did)] == [f"{k}.r0"]

    w2 = WorkerProc(cfg, pds_account, tmp_path / "w2.log")
    procs.append(w2)
    await asyncio.to_thread(w2.start)
    rec, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
    assert text_of(content) == "You said: tell me slowly"  # rewritten from scratch by the echo model
    assert await app.replies_of(k) == [f"{k}.r0"]
    assert "1 unfinished resumed" in w2.stdout or "claim(s) recovered" in w2.stdout
    assert w2.terminate() == 0
    with SqliteStore.open_dir(tmp_path / "state") as store:
        assert await store.unfinished_claims(app.did) == []
        assert (await store.get_claim(app.did, f"{k}.r0")).status == "complete"
    assert "logged in" not in (tmp_path / "w2.log").read_text()  # the session was resumed


async def test_restart_resumes_from_cursor_answering_messages_written_while_down_once(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    w1 = WorkerProc(cfg, pds_account, tmp_path / "w1.log")
    procs.append(w1)
    await asyncio.to_thread(w1.start)
    conv = new_tid()
    a = await app.send("message A", conversation=conv)
    await app.wait_status(f"{a}.r0", "complete")
    assert w1.terminate() == 0
    with SqliteStore.open_dir(tmp_path / "state") as store:
        cursor1 = await store.get_cursor(f"firehose:{dev_pds.pds_url.rstrip('/')}:{app.did}")
    assert isinstance(cursor1, int) and cursor1 > 0

    b = await app.send("message B", conversation=conv, parent=f"{a}.r0")
    c = await app.send("message C", conversation=new_tid())
    requests_before = len(model_server.requests)

    w2 = WorkerProc(cfg, pds_account, tmp_path / "w2.log")
    procs.append(w2)
    await asyncio.to_thread(w2.start)
    assert f"cursor {cursor1}" in w2.stdout
    _, cb = await app.wait_status(f"{b}.r0", "complete")
    _, cc = await app.wait_status(f"{c}.r0", "complete")
    assert text_of(cb) == "You said: message B" and text_of(cc) == "You said: message C"
    d = await app.send("message D", conversation=conv, parent=f"{b}.r0")
    await app.wait_status(f"{d}.r0", "complete")
    await asyncio.sleep(1.0)  # give a duplicate the chance to show up
    assert len(model_server.requests) - requests_before == 3  # B, C, D: once each; A not again
    for m in (a, b, c, d):
        assert await app.replies_of(m) == [f"{m}.r0"]
    assert w2.terminate() == 0
    with SqliteStore.open_dir(tmp_path / "state") as store:
        cursor2 = await store.get_cursor(f"firehose:{dev_pds.pds_url.rstrip('/')}:{app.did}")
    assert isinstance(cursor2, int) and cursor2 > cursor1


async def test_sigterm_during_a_turn_ends_it_interrupted_after_the_grace_period(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, procs: list[WorkerProc],
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    model_server.enqueue(Turn(text="long " * 400, chunk_size=5, chunk_delay=0.05))  # ~20 s
    w1 = WorkerProc(cfg, pds_account, tmp_path / "w1.log")
    procs.append(w1)
    await asyncio.to_thread(w1.start)
    k = await app.send("long answer please", conversation=new_tid())
    await app.wait_status(f"{k}.r0", "streaming", timeout=30, interval=0.05)
    t0 = time.monotonic()
    assert await asyncio.to_thread(w1.terminate, 30) == 0
    assert time.monotonic() - t0 < 15  # grace 2 s + bounded final write
    rec, content = await app.wait_status(f"{k}.r0", "error", timeout=5)
    assert rec.error is not None and rec.error.kind == "interrupted"
    assert "long" not in rec.error.message
    assert content is not None and text_of(content).startswith("long")  # what was streamed is kept
