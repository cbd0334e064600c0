"""Every turn ends, and every input gets a clean answer, on the real local PDS:

- a poison record (a field nested hundreds or thousands of levels deep, which the PDS
  stores) gets one ``bad_record`` reply and the worker restarts cleanly past it;
- an answer too large for one PDS write ends ``complete`` (cut, ``finishReason:
  length``) after exactly one model call, also when it streams on for 50 MB;
- a final write the PDS refuses for good ends in a minimal ``error`` reply, and the
  recovery sweep never calls the model again for it;
- a trickling provider ends ``timeout`` within ``[providers.<name>] deadline``, a turn
  that runs too long within ``[worker] turn_deadline``;
- an error reply keeps the model, the usage billed so far and ``finishReason: error``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gelbridge._dev.model_server import Delay, MidStreamError, ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import MESSAGE_COLLECTION, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._records.nesting import MAX_DEPTH
from gelbridge._sealing import Keyring, seal_content
from gelbridge._state import SqliteStore

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

WAIT = 90.0


def nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


async def put_raw(app: App, rkey: str, record: dict[str, Any]) -> None:
    """putRecord with the JSON written here: our own client (rightly) will not encode a
    value nested this deep, but an app can send one, and the PDS stores it."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))
    try:
        body = json.dumps({"repo": app.did, "collection": MESSAGE_COLLECTION, "rkey": rkey, "record": record})
    finally:
        sys.setrecursionlimit(limit)
    token = await app.pds._access_token()
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{app.pds.pds_url}/xrpc/com.atproto.repo.putRecord", content=body,
                            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:300]


def sealed(app: App, rkey: str, text: str) -> dict[str, Any]:
    return seal_content(PlainContent(parts=[TextPart(text=text)]), uri=app.uri(rkey), key_id=app.key_id,
                        keyring=app.keyring).to_value()


async def test_a_poison_record_gets_a_bad_record_reply_and_the_worker_restarts_past_it(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    conv = new_tid()
    poison: list[str] = []
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        for levels in (MAX_DEPTH + 2, 600, 1500):  # past our limit, past Python's, past the decoders'
            k = new_tid()
            await put_raw(app, k, {"$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
                                   "generation": {"attempt": 0}, "createdAt": now_datetime(),
                                   "content": sealed(app, k, "hi"), "extra": nested(levels)})
            poison.append(k)
        for k in poison:
            rec, _ = await app.wait_status(f"{k}.r0", "error", timeout=WAIT)
            assert rec.error is not None and rec.error.kind == "bad_record"
        ok = await app.send("still there?", conversation=conv)
        _, content = await app.wait_status(f"{ok}.r0", "complete", timeout=WAIT)
        assert text_of(content) == "You said: still there?"
        await worker.wait_idle(10)
    # a restart backfills over the same records (listRecords pages hold them): it starts,
    # answers what is new and does not answer the poison twice
    async with running_worker(settings, pds_account, keyring[0]) as worker2:
        assert worker2.started
        again = await app.send("after the restart", conversation=conv)
        _, content = await app.wait_status(f"{again}.r0", "complete", timeout=WAIT)
        assert text_of(content) == "You said: after the restart"
        await worker2.wait_idle(10)
    for k in poison:
        assert await app.replies_of(k) == [f"{k}.r0"]
    assert len(model_server.requests) == 2


async def test_an_answer_too_large_for_one_write_is_cut_and_ends_complete_after_one_model_call(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        results = {}
        for name, turn in (("200KB", Turn(text="a" * 200_000)),
                           ("50MB", Turn(text="b" * 50_000_000, chunk_size=64 * 1024))):
            before = len(model_server.requests)
            model_server.enqueue(turn)
            k = await app.send(f"write {name}", conversation=new_tid())
            started = time.monotonic()
            rec, content = await app.wait_status(f"{k}.r0", {"complete", "error"}, timeout=WAIT)
            results[name] = (rec, content, time.monotonic() - started)
            assert len(model_server.requests) == before + 1
        await worker.wait_idle(10)
        assert await worker.recover_claims() == 0  # nothing left for the sweep
    for name, (rec, content, took) in results.items():
        assert rec.status == "complete" and rec.finish_reason == "length", name
        text = text_of(content)
        assert 50_000 < len(text) < 120_000 and set(text) == {"a" if name == "200KB" else "b"}, (name, len(text))
        assert took < 60, (name, took)
    assert len(model_server.requests) == 2


async def test_a_final_write_the_pds_refuses_ends_in_a_minimal_error_and_the_model_is_not_asked_again(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    # an operator who set max_write_bytes above what this PDS takes (150 KiB): the write is refused
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             replies={"update_interval": 0, "max_write_bytes": 4_000_000})
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Turn(text="c" * 300_000, usage=(10, 20, 0)))
        k = await app.send("too much", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", "error", timeout=WAIT)
        await worker.wait_idle(10)
        assert await worker.recover_claims() == 0
        await worker.backfill()
        await worker.wait_idle(10)
    assert rec.error is not None and rec.error.kind == "server_error" and "refused" in rec.error.message
    assert content is not None and content.parts == []
    assert rec.model is not None and rec.model.id == "echo-1" and rec.finish_reason == "error"
    assert rec.usage is not None and rec.usage.output_tokens == 20
    assert len(model_server.requests) == 1  # never asked again
    with SqliteStore.open_dir(tmp_path / "state") as store:
        claim = await store.get_claim(app.did, f"{k}.r0")
        assert claim is not None and (claim.status, claim.error_kind) == ("error", "write_refused")


async def test_a_trickling_provider_ends_timeout_within_its_deadline(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             providers={"local": {"adapter": "openai", "base_url": model_server.url + "/v1",
                                                  "max_retries": 0, "read_timeout": 5, "deadline": 3}})
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        # a tiny delta every 0.5 s for a minute: the read timeout (5 s) never fires
        model_server.enqueue(Turn(text="drip " * 120, chunk_size=2, chunk_delay=0.5))
        k = await app.send("slowly", conversation=new_tid())
        started = time.monotonic()
        rec, content = await app.wait_status(f"{k}.r0", "error", timeout=WAIT)
        took = time.monotonic() - started
        await worker.wait_idle(10)
    assert rec.error is not None and rec.error.kind == "timeout"
    assert took < 20, took
    assert rec.finish_reason == "error" and rec.model is not None
    assert text_of(content).startswith("drip")  # what streamed before the deadline is kept


async def test_a_turn_past_its_deadline_ends_timeout(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             worker={"shutdown_grace": 2.0, "turn_deadline": 2})
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(Delay(30))
        k = await app.send("take your time", conversation=new_tid())
        started = time.monotonic()
        rec, _ = await app.wait_status(f"{k}.r0", "error", timeout=WAIT)
        took = time.monotonic() - started
        await worker.wait_idle(10)
    assert rec.error is not None and rec.error.kind == "timeout" and "turn_deadline" in rec.error.message
    assert took < 15, took


async def test_an_error_reply_keeps_the_model_the_usage_so_far_and_finish_reason_error(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             defaults={"model": {"provider": "anth", "id": "claude-sonnet-4-5"}, "effort": "low"},
                             providers={"anth": {"adapter": "anthropic", "base_url": model_server.url,
                                                 "max_retries": 0}})
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        model_server.enqueue(MidStreamError(after_chunks=8, turn=Turn(text="part of it " * 10, usage=(42, 7, 0), chunk_size=5)))
        k = await app.send("go", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", "error", timeout=WAIT)
        await worker.wait_idle(10)
    assert rec.finish_reason == "error"
    assert rec.model is not None and (rec.model.provider, rec.model.id) == ("anth", "claude-sonnet-4-5")
    assert rec.effort == "low"
    assert rec.usage is not None and rec.usage.input_tokens == 42  # billed: message_start carried it
    assert text_of(content).startswith("part of it")
