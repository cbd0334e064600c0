"""The worker answers sealed messages on the real local PDS (firehose source)."""

from __future__ import annotations

import asyncio

import pytest

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import App, running_worker, source_of, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(180)]


async def test_sealed_message_gets_sealed_reply_that_opens_to_model_text(
    settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer,
) -> None:
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        conv = new_tid()
        k = await app.send("what is two plus two?", conversation=conv)
        rec, content = await app.wait_status(f"{k}.r0", "complete")
        assert text_of(content) == "You said: what is two plus two?"
        assert rec.role == "assistant" and rec.parent == k and rec.conversation == conv
        assert rec.is_sealed and rec.content.key_id == keyring[1]
        assert rec.model is not None and (rec.model.provider, rec.model.id) == ("local", "echo-1")
        assert rec.finish_reason == "stop" and rec.updated_at is not None
        assert rec.usage is not None and rec.usage.output_tokens
        assert (await worker.store.get_claim(app.did, f"{k}.r0")).status == "complete"
    turns = worker.reports
    assert [r.status for r in turns] == ["complete"]


async def test_streaming_reply_is_updated_with_progress_not_per_token(
    settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer,
) -> None:
    text = "word " * 60
    model_server.enqueue(Turn(text=text, chunk_size=5, chunk_delay=0.02))  # 60 chunks over ~1.2 s
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        k = await app.send("stream please", conversation=new_tid())
        rec, content = await app.wait_status(f"{k}.r0", {"streaming"}, timeout=20, interval=0.05)
        assert content is not None and 0 < len(text_of(content)) < len(text)
        rec, content = await app.wait_status(f"{k}.r0", "complete")
        assert text_of(content) == text
        await worker.wait_idle(10)
    # update_interval 0.2 s over ~1.2 s of streaming: a handful of writes, far fewer than 60 chunks
    assert 1 <= worker.reports[0].progress_writes <= 10


async def test_regeneration_writes_next_attempt_and_branch_follows_users_parent(
    settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer,
) -> None:
    async with running_worker(settings, pds_account, keyring[0]):
        conv = new_tid()
        k = await app.send("first question", conversation=conv)
        await app.wait_status(f"{k}.r0", "complete")
        model_server.enqueue(Turn(text="second answer (regenerated)"))
        await app.regenerate(k, 1)
        _, c1 = await app.wait_status(f"{k}.r1", "complete")
        assert text_of(c1) == "second answer (regenerated)"
        r0, c0 = await app.wait_status(f"{k}.r0", "complete")  # the older attempt is untouched
        assert text_of(c0) == "You said: first question"
        # the user continues from attempt 1
        model_server.clear()
        k2 = await app.send("follow-up", conversation=conv, parent=f"{k}.r1")
        _, c2 = await app.wait_status(f"{k2}.r0", "complete")
        assert text_of(c2) == "You said: follow-up"
        body = model_server.requests[-1].body
        texts = [m.get("content") for m in body["messages"]]
        flat = " ".join(t if isinstance(t, str) else str(t) for t in texts)
        assert "second answer (regenerated)" in flat and "You said: first question" not in flat
        assert await app.replies_of(k) == [f"{k}.r0", f"{k}.r1"]


async def test_message_without_generation_gets_no_reply(
    settings: Settings, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
) -> None:
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        conv = new_tid()
        silent = await app.send("just a note", conversation=conv, generation={})
        # generation={} still asks (attempt defaults to 0); a message without the field does not
        k = new_tid()
        from gelbridge._records import MESSAGE_COLLECTION, PlainContent, TextPart, now_datetime
        from gelbridge._sealing import seal_content

        content = seal_content(PlainContent(parts=[TextPart(text="no reply wanted")]), uri=app.uri(k),
                               key_id=app.key_id, keyring=app.keyring)
        await app.pds.put_record(MESSAGE_COLLECTION, k, {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
            "content": content.to_value(), "createdAt": now_datetime(),
        })
        marker = await app.send("marker", conversation=new_tid())
        await app.wait_status(f"{marker}.r0", "complete")
        await app.wait_status(f"{silent}.r0", "complete")
        await worker.wait_idle(10)
        assert await app.reply(f"{k}.r0") is None


async def test_poll_source_answers_new_messages_once(
    dev_pds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path,
) -> None:
    from .conftest import make_settings

    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             watch={"source": "poll", "poll_interval": 0.3})
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        k = await app.send("polled", conversation=new_tid())
        _, c = await app.wait_status(f"{k}.r0", "complete")
        assert text_of(c) == "You said: polled"
        await asyncio.sleep(1.0)  # several more polls: nothing is answered twice
        assert await app.replies_of(k) == [f"{k}.r0"]
        assert len(model_server.requests) == 1 and source_of(worker).polls >= 2
