"""Text gelbridge cannot keep (NUL, lone surrogates) in records the live worker sees, on
the real PDS, with the SQLite file and with PostgreSQL: one clear refusal per record
(an error reply where the message can be addressed, else a log line and an error row),
and the account goes on: the messages after them are answered, no record is retried
for ever.

What reaches the worker which way (found on the reference PDS): NUL, U+FFFE and other
valid code points are stored and come back as written; a lone surrogate sent as
``\\ud800`` is stored as U+FFFD (the PDS's CBOR encoder replaces it), so a lone surrogate
only arrives through JSON the worker decodes itself: a Jetstream event (the second
test feeds such events to a Jetstream stand-in, next to the PDS's own events).
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._ingest import IncomingRecord
from gelbridge._records import MESSAGE_COLLECTION, PlainContent, TextPart, new_tid, now_datetime
from gelbridge._sealing import Keyring, seal_content
from gelbridge._state import SqliteStore
from gelbridge._worker.sources import FirehoseSource
from testkit.frames import jetstream_event
from testkit.jetstream_server import JetstreamServer

from .conftest import App, make_settings, running_worker, source_of, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(240)]


@pytest.fixture(params=["sqlite", "postgres"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The ``[state]`` section: the SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return {"dir": str(tmp_path / "state")}
    return {"dir": str(tmp_path / "state"), "url": request.getfixturevalue("postgres_url")}


def sealed_value(app: App, rkey: str, text: str, **fields: Any) -> dict[str, Any]:
    content = seal_content(PlainContent(parts=[TextPart(text=text)]), uri=app.uri(rkey), key_id=app.key_id,
                           keyring=app.keyring)
    return {"$type": MESSAGE_COLLECTION, "conversation": new_tid(), "role": "user", "content": content.to_value(),
            "generation": {"attempt": 0}, "createdAt": now_datetime(), **fields}


async def put(app: App, text: str, **fields: Any) -> str:
    rkey = new_tid()
    await app.pds.put_record(MESSAGE_COLLECTION, rkey, sealed_value(app, rkey, text, **fields))
    return rkey


async def no_reply(app: App, rkey: str) -> None:
    assert await app.replies_of(rkey) == []


async def test_nul_in_unsealed_fields_is_refused_alike_on_sqlite_and_postgres_and_the_account_goes_on(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, state: dict[str, Any],
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url, state=state)
    async with running_worker(settings, pds_account, keyring[0]) as worker:
        # its conversation cannot be stored (a claim holds it) nor repeated: not addressable
        nul_conv = await put(app, "nul conversation", conversation="3mconv\x00nul")
        # addressable: an error reply, in its own (storable) conversation
        nul_model = await put(app, "nul model", generation={"attempt": 0, "model": {"provider": "local",
                                                                                     "id": "echo\x00-1"}})
        # valid text that every backend stores: answered as any other
        odd_conv = "3mconv\ufffe\uffff\x85\u2028"
        odd = await put(app, "odd conversation", conversation=odd_conv)
        surrogate = await put(app, "surrogate", conversation="3mconv\ud800")  # the PDS keeps U+FFFD
        good = await put(app, "still there?")

        for rkey, said in ((good, "still there?"), (odd, "odd conversation"), (surrogate, "surrogate")):
            r, c = await app.wait_status(f"{rkey}.r0", "complete", timeout=60)
            assert text_of(c) == f"You said: {said}"
        assert (await app.reply(f"{odd}.r0"))[0].conversation == odd_conv  # type: ignore[index]
        assert (await app.reply(f"{surrogate}.r0"))[0].conversation == "3mconv\ufffd"  # type: ignore[index]
        r, _ = await app.wait_status(f"{nul_model}.r0", "error", timeout=60)
        assert r.error is not None and r.error.kind == "bad_record" and nul_model in r.error.message
        await worker.wait_idle(10)
        await no_reply(app, nul_conv)
        assert await worker.store.get_claim(worker.did, f"{nul_conv}.r0") is None
        errors = await worker.store.recent_errors(50)
        assert {(e.kind, e.record_key) for e in errors} >= {("bad_record", nul_conv), ("bad_record", nul_model)}
        assert source_of(worker) is not None and source_of(worker).retries == 0
        assert source_of(worker).cursor is not None


class Relay:
    """The PDS firehose, as Jetstream v1 events into the stand-in (``time_us`` rising)."""

    def __init__(self, server: JetstreamServer) -> None:
        self.server = server
        self.last = 0

    def time_us(self) -> int:
        self.last = max(self.last + 1, time.time_ns() // 1000)
        return self.last

    async def __call__(self, rec: IncomingRecord) -> None:
        self.server.publish(jetstream_event(rec.did, self.time_us(), rec.action, rec.collection, rec.rkey,
                                            dict(rec.record) if rec.record is not None else None, rec.cid))


async def test_lone_surrogates_and_nul_in_jetstream_events_are_skipped_and_the_stream_goes_on(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, state: dict[str, Any],
) -> None:
    async with JetstreamServer() as js, AsyncExitStack() as stack:
        relay_state = stack.enter_context(SqliteStore.open_dir(tmp_path / "relay"))
        relay = Relay(js)
        source = FirehoseSource(dev_pds.pds_url, app.did, relay_state, relay, key="relay")
        task = asyncio.create_task(source.run())
        stack.callback(task.cancel)
        await asyncio.wait_for(source.connected.wait(), 30)
        settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url, state=state,
                                 watch={"source": "jetstream", "url": js.url})
        async with running_worker(settings, pds_account, keyring[0]) as worker:
            hostile = new_tid()
            value = sealed_value(app, hostile, "x", conversation="3mconv\ud800")
            for rkey, cid, record in (
                ("3mk\ud800", "bafyreicid0", value),      # a record key no PDS can hold
                ("3mk\x00nul", "bafyreicid1", value),
                (hostile, "bafy\x00\ud800", value),        # a CID that is not one: counts as missing
                (new_tid(), "bafyreicid2", sealed_value(app, "3mkzzzzzzzzz2", "y", conversation="\x00")),
            ):
                js.publish(jetstream_event(app.did, relay.time_us(), "create", MESSAGE_COLLECTION, rkey,
                                           record, cid))
            good = await app.send("after them", conversation=new_tid())
            _, c = await app.wait_status(f"{good}.r0", "complete", timeout=60)
            assert text_of(c) == "You said: after them"
            await worker.wait_idle(10)
            src = source_of(worker)
            assert src is not None and src.reconnects == 0  # type: ignore[attr-defined]
            await no_reply(app, hostile)
            errors = {(e.kind, e.record_key) for e in await worker.store.recent_errors(50)}
            assert ("bad_record", hostile) in errors
            assert not [k for _, k in errors if k is not None and ("\x00" in k or "\ud800" in k)]
