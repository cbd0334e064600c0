"""Bad records, undecryptable messages and a PDS outage never stop the worker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._records import MESSAGE_COLLECTION, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._sealing import Keyring, seal_content

from .conftest import App, make_settings, running_worker, source_of, text_of
from .proxy import TcpProxy

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]


async def test_malformed_and_undecryptable_messages_get_one_error_reply_and_others_are_answered(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    conv = new_tid()
    # a key the worker does not have
    app.keyring.add_new("k-app-only")
    async with running_worker(settings, pds_account, Keyring({keyring[1]: keyring[0][keyring[1]]})) as worker:
        # malformed: content without $type, but plainly a user message asking for a reply
        bad = new_tid()
        await app.pds.put_record(MESSAGE_COLLECTION, bad, {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
            "content": {"parts": "nope"}, "generation": {"attempt": 0}, "createdAt": now_datetime(),
        })
        # unknown key
        unknown = await app.send("secret for another key", conversation=conv, key_id="k-app-only")
        # a ciphertext moved from another record
        moved = new_tid()
        sealed_elsewhere = seal_content(PlainContent(parts=[TextPart(text="moved")]), uri=app.uri(new_tid()),
                                        key_id=app.key_id, keyring=app.keyring)
        await app.pds.put_record(MESSAGE_COLLECTION, moved, {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
            "content": sealed_elsewhere.to_value(), "generation": {"attempt": 0}, "createdAt": now_datetime(),
        })
        good = await app.send("still there?", conversation=new_tid())

        _, cg = await app.wait_status(f"{good}.r0", "complete")
        assert text_of(cg) == "You said: still there?"
        rb, cb = await app.wait_status(f"{bad}.r0", "error")
        assert rb.error.kind == "bad_record" and bad in rb.error.message
        assert isinstance(cb, PlainContent) and cb.parts == []
        ru, cu = await app.wait_status(f"{unknown}.r0", "error")
        assert ru.error.kind == "decrypt_failed" and "secret" not in ru.error.message
        assert not ru.is_sealed and cu.parts == []  # no key to seal with: empty plain content
        rm, cm = await app.wait_status(f"{moved}.r0", "error")
        assert rm.error.kind == "decrypt_failed" and rm.is_sealed and cm.parts == []
        await worker.wait_idle(10)
        kinds = {e.kind for e in await worker.store.recent_errors()}
        assert {"bad_record", "decrypt_failed"} <= kinds
        cids = {k: (await app.pds.get_record(MESSAGE_COLLECTION, f"{k}.r0"))[0] for k in (bad, unknown, moved)}

    # a restart (backfill) answers none of them again
    requests = len(model_server.requests)
    async with running_worker(settings, pds_account, keyring[0]) as worker2:
        await asyncio.sleep(1.0)
        await worker2.wait_idle(10)
    for k, cid in cids.items():
        assert (await app.pds.get_record(MESSAGE_COLLECTION, f"{k}.r0"))[0] == cid
        assert await app.replies_of(k) == [f"{k}.r0"]
    assert len(model_server.requests) == requests


async def test_pds_outage_is_survived_and_messages_written_meanwhile_are_answered(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    u = urlsplit(dev_pds.pds_url)
    proxy = await TcpProxy(u.hostname or "127.0.0.1", u.port or 80).start()
    settings = make_settings(proxy.url, pds_account, tmp_path / "state", model_server.url)
    try:
        async with running_worker(settings, pds_account, keyring[0]) as worker:
            conv = new_tid()
            a = await app.send("before the outage", conversation=conv)
            await app.wait_status(f"{a}.r0", "complete")
            await proxy.outage()
            await asyncio.sleep(1.5)  # the worker notices (firehose lost) and backs off
            b = await app.send("during the outage", conversation=conv, parent=f"{a}.r0")
            await asyncio.sleep(1.0)
            assert await app.reply(f"{b}.r0") is None
            await proxy.restore()
            _, cb = await app.wait_status(f"{b}.r0", "complete", timeout=60)
            assert text_of(cb) == "You said: during the outage"
            c = await app.send("after the outage", conversation=conv, parent=f"{b}.r0")
            await app.wait_status(f"{c}.r0", "complete", timeout=30)
            assert source_of(worker).reconnects >= 1
            for m in (a, b, c):
                assert await app.replies_of(m) == [f"{m}.r0"]
    finally:
        await proxy.aclose()


async def test_pds_outage_during_a_turn_leaves_claim_that_is_finished_after_reconnect(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    from gelbridge._dev.model_server import Turn

    u = urlsplit(dev_pds.pds_url)
    proxy = await TcpProxy(u.hostname or "127.0.0.1", u.port or 80).start()
    settings = make_settings(proxy.url, pds_account, tmp_path / "state", model_server.url)
    model_server.enqueue(Turn(text="x " * 100, chunk_size=4, chunk_delay=0.05))  # ~2.5 s
    try:
        async with running_worker(settings, pds_account, keyring[0]) as worker:
            k = await app.send("answer through an outage", conversation=new_tid())
            await app.wait_status(f"{k}.r0", "streaming", timeout=30, interval=0.05)
            await proxy.outage()
            # The stream ends during the outage and the final write fails after its retries:
            # wait for the turn to give up (how long the retries take depends on the machine),
            # so the reply can only be finished by recovery after the PDS is back.
            for _ in range(600):  # bounded: 60 s
                if any(e.kind == "write_failed" and e.record_key == f"{k}.r0"
                       for e in await worker.store.recent_errors()):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the turn never gave up its final write during the outage")
            assert [c.reply_rkey for c in await worker.store.unfinished_claims(app.did)] == [f"{k}.r0"]
            await proxy.restore()
            _, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
            assert text_of(content) == "You said: answer through an outage"
            assert await app.replies_of(k) == [f"{k}.r0"]
            assert (await worker.store.get_claim(app.did, f"{k}.r0")).status == "complete"
    finally:
        await proxy.aclose()
