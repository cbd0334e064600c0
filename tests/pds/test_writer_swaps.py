"""A reply writer whose swap fails, on the real local PDS (issue 23): another client's
write lands between two writes of the writer, as a late write of a fleet's earlier
lease holder does. With an authority that says the reply is still the writer's (its
claim, in a real state store, is open) it re-reads the record and writes on; a reply
finished or deleted meanwhile, a claim finished, or a lease gone stop it, and contention
that never ends stops it after a bounded number of re-reads."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._errors import ClaimConflict, GelbridgeError, LeaseLost
from gelbridge._fleet import Lease
from gelbridge._pds import PdsClient
from gelbridge._records import MESSAGE_COLLECTION, MessageRecord, TextPart, new_tid
from gelbridge._records.constants import ReplyStatus
from gelbridge._sealing import Keyring, content_of
from gelbridge._state import SqliteStore
from gelbridge._worker.repo import RepoView
from gelbridge._worker.writer import (
    CLAIMED_ELSEWHERE,
    REPLY_DELETED,
    SWAP_RETRIES,
    Authority,
    ReplyWriter,
    claim_authority,
    reply_value,
)

pytestmark = [pytest.mark.pds, pytest.mark.timeout(120)]

SECRET = "words only the sealed content holds"


@pytest.fixture
async def clients(dev_pds: DevPds, pds_account: AccountInfo) -> AsyncIterator[tuple[PdsClient, PdsClient]]:
    """The writer's client and another one on the same account (the late writer)."""
    async with PdsClient(dev_pds.pds_url) as mine, PdsClient(dev_pds.pds_url) as other:
        await mine.login(pds_account.handle, pds_account.app_password)
        await other.login(pds_account.handle, pds_account.app_password)
        yield mine, other


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    with SqliteStore(tmp_path / "state.db") as s:
        yield s


class Setup:
    def __init__(self, mine: PdsClient, other: PdsClient, store: SqliteStore) -> None:
        self.mine, self.other, self.store = mine, other, store
        self.keyring = Keyring({"k1": secrets.token_bytes(32)})
        self.message = new_tid()
        self.rkey = f"{self.message}.r0"
        self.conversation = new_tid()

    def writer(self, authority: Authority | None, view: RepoView | None = None, **kw: Any) -> ReplyWriter:
        return ReplyWriter(self.mine, view or RepoView(self.mine, self.mine.did), reply_rkey=self.rkey,
                           message_rkey=self.message, conversation=self.conversation, key_id="k1",
                           keyring=self.keyring, authority=authority, **kw)

    def authority(self) -> Authority:
        return claim_authority(self.store, self.mine.did, self.rkey)

    async def claimed(self, authority: Authority | None = None, **kw: Any) -> ReplyWriter:
        await self.store.record_claim(self.mine.did, self.message, 0, self.rkey, self.conversation)
        w = self.writer(authority if authority is not None else self.authority(), **kw)
        await w.claim()
        return w

    async def late_write(self, status: str = "streaming", text: str = "zebra quartz words") -> str:
        """Another client writes the reply, swapping on the CID it has now (as a write sent
        by an earlier holder before the writer read the record lands after)."""
        got = await self.other.get_record(MESSAGE_COLLECTION, self.rkey)
        assert got is not None
        w = ReplyWriter(self.other, RepoView(self.other, self.other.did), reply_rkey=self.rkey,
                        message_rkey=self.message, conversation=self.conversation, key_id="k1",
                        keyring=self.keyring)
        value = reply_value(conversation=self.conversation, parent=self.message, content=w.content(
            [TextPart(text=text)]), status=ReplyStatus(status), created_at=got[1]["createdAt"])
        res = await self.other.put_record(MESSAGE_COLLECTION, self.rkey, value, swap_record=got[0])
        return res.cid

    async def stored(self) -> tuple[str, list[str]] | None:
        got = await self.other.get_record(MESSAGE_COLLECTION, self.rkey)
        if got is None:
            return None
        rec = MessageRecord.from_value(got[1])
        opened = content_of(rec.content, uri=f"at://{self.mine.did}/{MESSAGE_COLLECTION}/{self.rkey}",
                            keyring=self.keyring)
        return rec.status, [p.text for p in opened.parts if isinstance(p, TextPart)]


@pytest.fixture
def s(clients: tuple[PdsClient, PdsClient], store: SqliteStore) -> Setup:
    return Setup(*clients, store)


async def test_a_late_write_on_a_reply_still_held_is_written_over_progress_and_final(
    s: Setup, caplog: pytest.LogCaptureFixture,
) -> None:
    w = await s.claimed(update_interval=0.01)
    await s.late_write()
    w._last_progress = -1.0  # a progress write is due
    w.maybe_progress(lambda: [TextPart(text=SECRET)])
    await w.settle()
    assert not w.lost and w.progress_writes == 1 and w.swap_retries == 1
    assert await s.stored() == ("streaming", [SECRET])
    await s.late_write()  # and once more before the final write
    with caplog.at_level(logging.INFO, logger="gelbridge"):
        await w.final([TextPart(text=SECRET + " (done)")], status=ReplyStatus.COMPLETE)
    assert await s.stored() == ("complete", [SECRET + " (done)"])
    assert w.swap_retries == 2
    assert "writing on from its current version" in caplog.text and s.rkey in caplog.text
    assert SECRET not in caplog.text and "zebra" not in caplog.text  # no content in the log


async def test_a_reply_someone_else_finished_is_left_as_it_is(s: Setup) -> None:
    w = await s.claimed()
    await s.late_write(status="complete", text="finished elsewhere")
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text=SECRET)], status=ReplyStatus.COMPLETE)
    assert await s.stored() == ("complete", ["finished elsewhere"])
    assert w.lost and w.lost_claim() == (ReplyStatus.COMPLETE, CLAIMED_ELSEWHERE)


async def test_a_deleted_reply_is_not_written_again(s: Setup) -> None:
    w = await s.claimed()
    await s.other.delete_record(MESSAGE_COLLECTION, s.rkey)
    with pytest.raises(ClaimConflict):
        await w.checkpoint([TextPart(text=SECRET)])
    assert await s.stored() is None
    assert w.lost_claim() == (ReplyStatus.CANCELLED, REPLY_DELETED)


async def test_a_finished_claim_stops_the_writer_and_is_left_as_it_is(s: Setup) -> None:
    w = await s.claimed()
    await s.store.update_claim_status(s.mine.did, s.rkey, ReplyStatus.CANCELLED)
    await s.late_write()
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text=SECRET)], status=ReplyStatus.COMPLETE)
    assert await s.stored() == ("streaming", ["zebra quartz words"])
    assert w.lost_claim() is None  # the claim says how it ended already


async def test_a_lost_lease_stops_the_writer_without_a_write(s: Setup) -> None:
    lease = Lease("acct", "me", 1, 15.0, valid_until=0.0)  # ran out: check() raises LeaseLost
    ours = s.authority()

    async def fenced() -> bool:
        lease.check()
        return await ours()

    w = await s.claimed(authority=fenced)
    await s.late_write()
    with pytest.raises(LeaseLost):
        await w.final([TextPart(text=SECRET)], status=ReplyStatus.COMPLETE)
    assert await s.stored() == ("streaming", ["zebra quartz words"])


class RacedView(RepoView):
    """Each fresh read of the reply is followed at once by another write to it (a writer
    that always gets in first), so the writer's swap on what it read always fails."""

    def __init__(self, s: Setup) -> None:
        super().__init__(s.mine, s.mine.did)
        self.s = s
        self.reads = 0

    async def get(self, rkey: str, *, fresh: bool = False) -> Any:
        got = await super().get(rkey, fresh=fresh)
        if fresh:
            self.reads += 1
            await self.s.late_write(text=f"interloper {self.reads}")
        return got


async def test_contention_that_never_ends_fails_the_write_after_a_bounded_number_of_rereads(s: Setup) -> None:
    view = RacedView(s)
    await s.store.record_claim(s.mine.did, s.message, 0, s.rkey, s.conversation)
    w = s.writer(s.authority(), view=view)
    await w.claim()
    await s.late_write()
    with pytest.raises(GelbridgeError, match="kept changing") as e:
        await w.final([TextPart(text=SECRET)], status=ReplyStatus.COMPLETE)
    assert not isinstance(e.value, ClaimConflict) and e.value.kind == "server_error"
    assert view.reads == SWAP_RETRIES and w.swap_retries == SWAP_RETRIES
    assert w.writes == 1  # the claim only
    assert (await s.stored() or ("", []))[0] == "streaming"


async def test_without_an_authority_a_changed_reply_is_someone_elses(s: Setup) -> None:
    await s.store.record_claim(s.mine.did, s.message, 0, s.rkey, s.conversation)
    w = s.writer(None)
    await w.claim()
    await s.late_write()
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text=SECRET)], status=ReplyStatus.COMPLETE)
    assert await s.stored() == ("streaming", ["zebra quartz words"])
    assert w.lost_claim() == (ReplyStatus.CANCELLED, "claim_lost")  # the sweep looks at it again
