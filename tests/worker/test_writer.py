"""Reply writes: sealed, swap on the last CID, progress throttled (never per token)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gelbridge._errors import ClaimConflict
from gelbridge._records import MessageRecord, TextPart
from gelbridge._sealing import Keyring, content_of
from gelbridge._worker.repo import RepoView
from gelbridge._worker.writer import ReplyWriter
from testkit.worker_fakes import DID, Clock, FakePds


@pytest.fixture
def setup() -> tuple[FakePds, Keyring, str, Clock, ReplyWriter]:
    pds = FakePds()
    kr = Keyring()
    kid = kr.add_new("k1")
    clock = Clock()
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                    key_id=kid, keyring=kr, update_interval=2.0, clock=clock)
    return pds, kr, kid, clock, w


async def test_claim_progress_and_final_are_sealed_and_chained_by_cid(setup: Any) -> None:
    pds, kr, kid, clock, w = setup
    await w.claim()
    assert pds.puts[0][2] is None and pds.puts[0][1]["status"] == "pending"
    for i in range(100):  # 100 "tokens" within 1.9 s: no progress write
        clock.t = i * 0.019
        w.maybe_progress(lambda i=i: [TextPart(text="x" * (i + 1))])
    await asyncio.sleep(0)
    assert len(pds.puts) == 1
    clock.t = 2.5
    w.maybe_progress(lambda: [TextPart(text="partial")])
    await w.settle()
    assert len(pds.puts) == 2 and pds.puts[1][1]["status"] == "streaming" and pds.puts[1][2] == "cid0"
    await w.final([TextPart(text="done")], status="complete")
    rkey, value, swap = pds.puts[-1]
    assert swap == "cid1" and value["status"] == "complete" and "updatedAt" in value
    rec = MessageRecord.from_value(value)
    opened = content_of(rec.content, uri=f"at://{DID}/chat.gel.assistant.message/3mk.r0", keyring=kr)
    assert [p.text for p in opened.parts] == ["done"]


async def test_parts_that_did_not_change_are_built_again_only_an_interval_later(setup: Any) -> None:
    """A stream of 40,000 citation events, after the 256 sources a reply keeps, rebuilt the
    unchanged parts on every event (the early return noted no time): minutes of event loop."""
    pds, kr, kid, clock, w = setup
    await w.claim()
    builds = 0

    def same() -> list[TextPart]:
        nonlocal builds
        builds += 1
        return [TextPart(text="unchanged")]

    clock.t = 2.5
    w.maybe_progress(same)
    await w.settle()
    assert builds == 1 and len(pds.puts) == 2
    for i in range(40_000):  # 40,000 events over 10 s of stream
        clock.t = 5.0 + i * 0.00025
        w.maybe_progress(same)
    await w.settle()
    assert len(pds.puts) == 2  # nothing new: nothing written
    assert builds <= 1 + 10 / 2.0 + 1  # at most one build an interval


async def test_interval_zero_means_only_claim_and_final(setup: Any) -> None:
    pds, kr, kid, clock, w = setup
    w.update_interval = 0
    await w.claim()
    clock.t = 100
    w.maybe_progress(lambda: [TextPart(text="x")])
    await w.final([TextPart(text="y")], status="complete")
    assert [p[1]["status"] for p in pds.puts] == ["pending", "complete"]


async def test_a_reply_changed_by_someone_else_is_never_overwritten(setup: Any) -> None:
    pds, kr, kid, clock, w = setup
    await w.claim()
    pds.records["3mk.r0"] = ("someone-else", pds.records["3mk.r0"][1])
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text="y")], status="complete")
    with pytest.raises(ClaimConflict):
        await w.claim()


async def test_a_plain_message_gets_plain_content_and_an_unknown_key_gets_none() -> None:
    pds = FakePds()
    plain = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mp.r0", message_rkey="3mp", conversation="3mc",
                        key_id=None, keyring=Keyring(), update_interval=0)
    assert plain.can_write_parts
    await plain.claim()
    await plain.final([TextPart(text="in the clear")], status="complete")
    rec = MessageRecord.from_value(pds.puts[-1][1])
    assert not rec.is_sealed and [p.text for p in rec.content.parts] == ["in the clear"]

    locked = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mq.r0", message_rkey="3mq", conversation="3mc",
                         key_id="k-not-here", keyring=Keyring(), update_interval=0)
    assert not locked.can_write_parts
    await locked.claim()
    with pytest.raises(Exception, match="not in the keyring"):
        await locked.final([TextPart(text="must not be written in the clear")], status="complete")
    await locked.final([], status="error")
    assert MessageRecord.from_value(pds.puts[-1][1]).content.parts == []


def test_parts_are_cut_to_the_budget_keeping_calls_with_their_results_and_whole_characters() -> None:
    from gelbridge._records import ReasoningPart, ToolCallPart, ToolResultPart
    from gelbridge._worker.writer import content_budget, content_bytes, fit_parts, size_bound

    assert 100_000 < content_budget(150 * 1024) < 115_000  # ~110 KB of content fits the reference PDS
    parts = [ReasoningPart(text="r" * 1000), TextPart(text="é" * 5000),
             ToolCallPart(call_id="c1", tool="t", input="{}"), ToolResultPart(call_id="c1", output="o" * 3000),
             TextPart(text="\u2603\n" * 4000)]
    total = content_bytes(parts)
    assert size_bound(parts) >= total
    kept, cut = fit_parts(parts, total)
    assert (kept, cut) == (parts, False)
    for budget in (total - 1, 12_000, 11_000, 6_000, 500):
        kept, cut = fit_parts(parts, budget)
        assert cut and content_bytes(kept) <= budget, budget
        types = [type(p).__name__ for p in kept]
        assert ("ToolCallPart" in types) == ("ToolResultPart" in types), (budget, types)  # never one alone
        assert all(p == q for p, q in zip(kept[:-1], parts))  # only the last kept part may be shortened
        if kept and isinstance(kept[-1], TextPart):
            assert parts[len(kept) - 1].text.startswith(kept[-1].text)


async def test_a_progress_write_is_cut_to_fit_one_record() -> None:
    pds = FakePds()
    kr = Keyring()
    kid = kr.add_new("k1")
    clock = Clock()
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                    key_id=kid, keyring=kr, update_interval=1.0, clock=clock, max_write_bytes=20_000)
    await w.claim()
    clock.t = 5
    w.maybe_progress(lambda: [TextPart(text="z" * 100_000)])
    await w.settle()
    rec = MessageRecord.from_value(pds.puts[-1][1])
    opened = content_of(rec.content, uri=f"at://{DID}/chat.gel.assistant.message/3mk.r0", keyring=kr)
    assert 0 < len(opened.parts[0].text) <= w.content_budget and set(opened.parts[0].text) == {"z"}


# --- a failed swap on a reply the writer still holds (a fleet: issue 23) ---------------------------


class Authority:
    """The fleet's word on whether the reply is still this writer's (the lease and the
    shared claim): ``answer`` is returned, or raised when it is an exception."""

    def __init__(self, answer: bool | Exception = True) -> None:
        self.answer = answer
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def held_writer(pds: FakePds, kr: Keyring, kid: str, authority: Authority, clock: Clock | None = None) -> ReplyWriter:
    return ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                       key_id=kid, keyring=kr, update_interval=2.0, clock=clock or Clock(), authority=authority)


def late_write(pds: FakePds, status: str = "streaming", cid: str = "late") -> None:
    """Someone else's write lands on the reply (an earlier holder's, sent before it stopped)."""
    cur = pds.records["3mk.r0"]
    pds.records["3mk.r0"] = (cid, {**cur[1], "status": status})


def opened_text(kr: Keyring, value: dict[str, Any]) -> str:
    rec = MessageRecord.from_value(value)
    content = content_of(rec.content, uri=f"at://{DID}/chat.gel.assistant.message/3mk.r0", keyring=kr)
    return "".join(p.text for p in content.parts)


async def test_a_late_write_is_written_over_when_the_authority_says_the_reply_is_still_ours(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    clock = Clock()
    authority = Authority(True)
    w = held_writer(pds, kr, kid, authority, clock)
    await w.claim()
    late_write(pds)
    clock.t = 3
    w.maybe_progress(lambda: [TextPart(text="secret words")])  # a progress write: re-read, then written
    await w.settle()
    assert pds.puts[-1][2] == "late" and pds.puts[-1][1]["status"] == "streaming"
    assert w.progress_writes == 1 and w.swap_retries == 1 and not w.lost and authority.asked == 1
    late_write(pds, cid="later")
    await w.final([TextPart(text="secret answer")], status="complete")  # the final write too
    assert pds.puts[-1][2] == "later" and opened_text(kr, pds.puts[-1][1]) == "secret answer"
    assert w.swap_retries == 2 and w.cid == pds.records["3mk.r0"][0]
    assert "secret" not in caplog.text and "writing on from its current version" in caplog.text


@pytest.mark.parametrize(("status", "claim"), [("complete", ("complete", "claimed_elsewhere")),
                                               ("error", ("error", "claimed_elsewhere")),
                                               ("cancelled", ("cancelled", "claimed_elsewhere")),
                                               (None, ("cancelled", "reply_deleted"))])
async def test_a_reply_finished_or_deleted_by_someone_else_is_left_as_it_is(
    status: str | None, claim: tuple[str, str],
) -> None:
    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    w = held_writer(pds, kr, kid, Authority(True))
    await w.claim()
    if status is None:
        del pds.records["3mk.r0"]
    else:
        late_write(pds, status=status)
    writes = len(pds.puts)
    with pytest.raises(ClaimConflict):
        await w.checkpoint([TextPart(text="x")])
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text="y")], status="complete")
    assert len(pds.puts) == writes and w.lost  # nothing written over it
    assert w.lost_claim() == claim


async def test_a_reply_whose_claim_is_finished_is_not_written_and_its_claim_left_alone() -> None:
    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    w = held_writer(pds, kr, kid, Authority(False))
    await w.claim()
    late_write(pds)
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text="y")], status="complete")
    assert len(pds.puts) == 1 and w.lost_claim() is None


async def test_a_writer_that_lost_its_lease_stops_without_a_write() -> None:
    from gelbridge._errors import LeaseLost

    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    w = held_writer(pds, kr, kid, Authority(LeaseLost("gone")))
    await w.claim()
    late_write(pds)
    with pytest.raises(LeaseLost):
        await w.final([TextPart(text="y")], status="complete")
    assert len(pds.puts) == 1


async def test_without_an_authority_a_changed_reply_is_someone_elses_and_its_claim_lost() -> None:
    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                    key_id=kid, keyring=kr)
    await w.claim()
    late_write(pds)
    with pytest.raises(ClaimConflict):
        await w.final([TextPart(text="y")], status="complete")
    assert len(pds.puts) == 1 and w.swap_retries == 0
    assert w.lost_claim() == ("cancelled", "claim_lost")


class RacingPds(FakePds):
    """Someone else writes the reply again before each of our writes lands."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def put_record(self, collection: str, rkey: str, value: dict[str, Any], *, swap_record: Any,
                         must_land: bool = False) -> Any:
        if swap_record is not None:
            self.attempts += 1
            late_write(self, cid=f"race{self.attempts}")
        return await super().put_record(collection, rkey, value, swap_record=swap_record, must_land=must_land)


class UnreadablePds(FakePds):
    async def get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> Any:
        from gelbridge._errors import PdsError

        raise PdsError("getRecord failed", status=400)


@pytest.mark.parametrize("pds_type", [RacingPds, UnreadablePds])
async def test_re_reading_is_bounded_and_ends_in_a_server_error(pds_type: type[FakePds]) -> None:
    from gelbridge._errors import GelbridgeError
    from gelbridge._worker.writer import SWAP_RETRIES

    pds, kr = pds_type(), Keyring()
    kid = kr.add_new("k1")
    w = held_writer(pds, kr, kid, Authority(True))
    await w.claim()
    if pds_type is UnreadablePds:
        late_write(pds)
    with pytest.raises(GelbridgeError, match="kept changing") as err:
        await w.final([TextPart(text="y")], status="complete")
    assert err.value.kind == "server_error" and not isinstance(err.value, ClaimConflict)
    assert len(pds.puts) == 1  # only the claim landed
    if isinstance(pds, RacingPds):
        assert pds.attempts == SWAP_RETRIES + 1 and w.swap_retries == SWAP_RETRIES


async def test_re_reading_is_bounded_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from gelbridge._errors import GelbridgeError
    from gelbridge._worker import writer

    monkeypatch.setattr(writer, "SWAP_RETRY_SECONDS", -1.0)
    pds, kr = FakePds(), Keyring()
    kid = kr.add_new("k1")
    authority = Authority(True)
    w = held_writer(pds, kr, kid, authority)
    await w.claim()
    late_write(pds)
    with pytest.raises(GelbridgeError, match="kept changing"):
        await w.final([TextPart(text="y")], status="complete")
    assert authority.asked == 0 and len(pds.puts) == 1


class SlowPds(FakePds):
    """Each putRecord takes ``latency`` seconds of the test's clock; the times it was sent
    and answered are kept."""

    def __init__(self, clock: Clock, latency: float) -> None:
        super().__init__()
        self.clock, self.latency = clock, latency
        self.times: list[tuple[float, float, str]] = []

    async def put_record(self, collection: str, rkey: str, value: dict[str, Any], *, swap_record: Any,
                         must_land: bool = False) -> Any:
        sent = self.clock.t
        self.clock.t += self.latency
        res = await super().put_record(collection, rkey, value, swap_record=swap_record, must_land=must_land)
        self.times.append((sent, self.clock.t, value["status"]))
        return res


async def test_progress_waits_the_interval_from_when_the_previous_write_landed() -> None:
    """The gap an app sees between two revisions is never shorter than the interval,
    however long a write takes (it was counted from when the previous one was sent:
    with 0.9 s writes, revisions 1.1 s apart at ``update_interval = 2``)."""
    clock = Clock()
    pds = SlowPds(clock, latency=0.9)
    kr = Keyring()
    kid = kr.add_new("k1")
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                    key_id=kid, keyring=kr, update_interval=2.0, clock=clock)
    await w.claim()  # sent at 0, landed at 0.9
    n = 0
    while clock.t < 20:  # a token every 50 ms; each write moves the clock on by its latency
        n += 1
        w.maybe_progress(lambda n=n: [TextPart(text="x" * n)])
        await w.settle()
        clock.t += 0.05
    checkpoint = len(pds.times)
    await w.checkpoint([TextPart(text="a tool step")])
    w.maybe_progress(lambda: [TextPart(text="after the checkpoint")])
    await w.settle()
    assert len(pds.times) == checkpoint + 1  # the interval counts from the checkpoint too
    clock.t += 2.0
    w.maybe_progress(lambda: [TextPart(text="after the checkpoint")])
    await w.settle()
    await w.final([TextPart(text="done")], status="complete")
    statuses = [s for _, _, s in pds.times]
    assert statuses[0] == "pending" and statuses[-1] == "complete" and statuses.count("streaming") >= 7
    assert len(pds.times) == checkpoint + 3
    for i in range(1, len(pds.times) - 1):  # every write but the final one
        if i != checkpoint:  # written now, whatever the interval (docs/worker.md)
            assert pds.times[i][0] - pds.times[i - 1][1] >= 2.0 - 1e-9, (i, pds.times)
