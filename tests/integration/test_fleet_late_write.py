"""A late write after a fleet takeover never leaves a reply stuck at ``streaming``
(issue 23): the old holder's progress write, held on its way to the real PDS, lands after
the new holder read the record; the new holder's next write fails ``InvalidSwap``, and it
must re-read the record and go on, since the lease (PostgreSQL) says the reply is its."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._fleet import LeaseBook
from gelbridge._records import MESSAGE_COLLECTION, TextPart, new_tid
from gelbridge._records.constants import ReplyStatus
from gelbridge._state._postgres import PostgresStore
from gelbridge._worker import Worker
from gelbridge._worker.repo import RepoView
from gelbridge._worker.writer import ReplyWriter

from .conftest import PASSWORD_ENV, App, make_settings, text_of
from .late_write import B_TEXT, late_write

pytestmark = [pytest.mark.pds, pytest.mark.postgres, pytest.mark.timeout(180)]


async def test_the_new_holder_finishes_a_reply_the_old_holders_late_write_changed(
    tmp_path: Path, dev_pds: DevPds, pds_account: AccountInfo, postgres_url: str,
) -> None:
    run = await late_write(tmp_path, dev_pds.pds_url, postgres_url, pds_account)
    assert run.landed_late  # the attack happened: A's write landed (HTTP 200) after B had read the reply
    assert run.status == "complete", run
    assert run.text == B_TEXT
    assert run.claim == ("complete", None)
    assert run.outcomes == ["complete"]
    assert run.replies == 1


STALE = 10.0  # [worker] stale_claim_after in the sweep test


async def _left_behind(app: App, w: Worker, text: str, reply_status: str | None) -> str:
    """A reply as an older gelbridge left it after a failed swap: the claim ``cancelled``
    with ``claim_lost``, the record ``streaming`` (or finished, or deleted, by someone else)."""
    rkey = await app.send(text, conversation=new_tid())
    reply = f"{rkey}.r0"
    conv = (await app.get(rkey) or ("", {}))[1]["conversation"]
    await w.store.record_claim(w.did, rkey, 0, reply, conv)
    old = ReplyWriter(app.pds, RepoView(app.pds, app.did), reply_rkey=reply, message_rkey=rkey,
                      conversation=conv, key_id=app.key_id, keyring=app.keyring)
    await old.claim()
    await old.checkpoint([TextPart(text="half an answer")])
    if reply_status == "deleted":
        await app.pds.delete_record(MESSAGE_COLLECTION, reply)
    elif reply_status is not None:
        await old.final([TextPart(text="finished by someone else")], status=ReplyStatus(reply_status))
    await w.store.update_claim_status(w.did, reply, ReplyStatus.CANCELLED, "claim_lost")
    return rkey


@pytest.mark.parametrize("fleet", [False, True], ids=["one-worker", "fleet"])
async def test_the_sweep_finishes_a_reply_whose_claim_was_given_up_while_it_is_unfinished(
    tmp_path: Path, dev_pds: DevPds, pds_account: AccountInfo, postgres_url: str, app: App,
    model_server: ModelServer, fleet: bool,
) -> None:
    kw: dict[str, Any] = {}
    if fleet:  # the account's lease makes the reply this worker's at once
        store = await PostgresStore(postgres_url).open()
        book = LeaseBook(store, "member-s", [pds_account.handle.lower()], 30.0)
        await book.register()
        kw = {"store": store, "fence": (await book.beat({})).held[pds_account.handle.lower()]}
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             worker={"stale_claim_after": STALE, "shutdown_grace": 2.0})
    w = Worker(settings, keyring=app.keyring, environ={PASSWORD_ENV: pds_account.app_password}, **kw)
    await w.start()
    try:
        stuck = await _left_behind(app, w, "left behind", None)
        written = time.monotonic()
        done = await _left_behind(app, w, "finished elsewhere", "complete")
        gone = await _left_behind(app, w, "deleted", "deleted")

        await w.recover_claims()
        claim = await w.store.get_claim(w.did, f"{done}.r0")
        assert claim is not None and (claim.status, claim.error_kind) == ("complete", "claimed_elsewhere")
        claim = await w.store.get_claim(w.did, f"{gone}.r0")
        assert claim is not None and (claim.status, claim.error_kind) == ("cancelled", "reply_deleted")
        if not fleet:  # another gelbridge may still be writing it: left alone until it is stale
            assert time.monotonic() - written < STALE - 2, "the set-up took too long to see this"
            await w.wait_idle(5)
            rec = await app.reply(f"{stuck}.r0")
            assert rec is not None and rec[0].status == "streaming"
            await asyncio.sleep(max(0.0, STALE + 1 - (time.monotonic() - written)))
            await w.recover_claims()
        rec_, content = await app.wait_status(f"{stuck}.r0", "complete", timeout=30)
        assert text_of(content) == "You said: left behind"
        assert await w.wait_idle(30)
        claim = await w.store.get_claim(w.did, f"{stuck}.r0")
        assert claim is not None and claim.status == "complete"
        assert await app.replies_of(stuck) == [f"{stuck}.r0"]
        rec = await app.reply(f"{done}.r0")
        assert rec is not None and text_of(rec[1]) == "finished by someone else"  # never overwritten
        assert await app.reply(f"{gone}.r0") is None  # never written again
    finally:
        await w.aclose()
        if fleet:
            await kw["store"].aclose()
