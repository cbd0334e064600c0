"""The state store's rules, on both backends (SQLite file and shared Postgres): persistence,
idempotency, at-most-once tool calls, crash recovery, concurrent writers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable

import pytest

from gelbridge._errors import StateError, ToolJournalConflict
from gelbridge._records.constants import ReplyStatus
from gelbridge._state import ERRORS_KEPT, CallRef, CallState, StateStore, TurnTiming, claim_status

OpenStore = Callable[..., StateStore]  # the conftest's open_store fixture


async def test_everything_survives_close_and_reopen(open_store: OpenStore) -> None:
    async with open_store() as s:
        await s.set_cursor("firehose:pds.example", 1234)
        await s.set_cursor("jetstream", "1700000000000000")
        await s.save_session("did:plc:abc", {"accessJwt": "a", "refreshJwt": "r"})
        await s.record_claim("did:plc:abc", "3mabc", 0, "3mabc.r0", "3mconv")
        await s.begin_tool_call(CallRef("did:plc:abc", "3mconv", "call_1"), "3mabc.r0", "current_time", "d1")
        await s.finish_tool_call(CallRef("did:plc:abc", "3mconv", "call_1"), b"\x00sealed\xff", "k1", False)
        await s.record_error("timeout", account="did:plc:abc", record_key="3mabc.r0", where="model")
        await s.record_turn(TurnTiming("3mabc.r0", "did:plc:abc", "complete", 1, 2, 300, 40))
        assert await s.mark_seen("did:plc:abc", "3mabc", "bafy1")
    async with open_store() as s:
        assert await s.get_cursor("firehose:pds.example") == 1234
        assert await s.get_cursor("jetstream") == "1700000000000000"
        assert await s.get_cursor("other") is None
        assert await s.load_session("did:plc:abc") == {"accessJwt": "a", "refreshJwt": "r"}
        assert await s.load_session("did:plc:other") is None
        claim = await s.get_claim("did:plc:abc", "3mabc.r0")
        assert claim is not None and claim.status == "pending" and claim.attempt == 0
        entry = await s.get_tool_call(CallRef("did:plc:abc", "3mconv", "call_1"))
        assert entry is not None and entry.finished and entry.sealed_result == b"\x00sealed\xff"
        assert entry.key_id == "k1" and entry.is_error is False
        assert [e.kind for e in await s.recent_errors(5)] == ["timeout"]
        turn = (await s.recent_turns(5))[0]
        assert turn.total_ms == 343 and turn.at > 0
        assert not await s.mark_seen("did:plc:abc", "3mabc", "bafy1")
        assert await s.was_seen("did:plc:abc", "3mabc", "bafy1")


async def test_cursor_overwrites_and_keeps_type(open_store: OpenStore) -> None:
    async with open_store() as s:
        await s.set_cursor("src", 5)
        await s.set_cursor("src", 7)
        assert await s.get_cursor("src") == 7
        await s.set_cursor("src", "abc")
        assert await s.get_cursor("src") == "abc"
        with pytest.raises(TypeError):
            await s.set_cursor("src", 1.5)  # type: ignore[arg-type]


C1 = CallRef("did:a", "conv", "c1")


async def test_begin_tool_call_is_idempotent(open_store: OpenStore) -> None:
    async with open_store() as s:
        first = await s.begin_tool_call(C1, "m.r0", "fetch_url", "digest")
        assert first.new and first.state == "started" and not first.interrupted
        again = await s.begin_tool_call(C1, "m.r1", "fetch_url", "digest")
        assert not again.new and again.reply_rkey == "m.r0"
        await s.finish_tool_call(C1, b"R1", "k", True)
        done = await s.begin_tool_call(C1, "m.r2", "fetch_url", "digest")
        assert not done.new and done.finished and done.sealed_result == b"R1" and done.is_error is True
        # A second finish does not overwrite the first result: at most once.
        kept = await s.finish_tool_call(C1, b"R2", "k", False)
        assert kept.sealed_result == b"R1"


async def test_reused_call_id_with_other_input_in_the_same_conversation_is_a_conflict(open_store: OpenStore) -> None:
    async with open_store() as s:
        await s.begin_tool_call(C1, "m.r0", "fetch_url", "digest-a")
        with pytest.raises(ToolJournalConflict) as e:
            await s.begin_tool_call(C1, "m.r0", "fetch_url", "digest-b")
        assert "c1" not in str(e.value)  # the id is the provider's: never in a message


async def test_the_same_call_id_in_another_conversation_or_account_is_another_call(open_store: OpenStore) -> None:
    """Providers without ids (or with repeated ones) give ``call__0`` everywhere: each
    conversation and account has its own call and result."""
    async with open_store() as s:
        await s.begin_tool_call(C1, "m.r0", "fetch_url", "digest-a")
        await s.finish_tool_call(C1, b"R-conv", "k1", False)
        other_conv = await s.begin_tool_call(CallRef("did:a", "conv2", "c1"), "n.r0", "fetch_url", "digest-b")
        same_input = await s.begin_tool_call(CallRef("did:a", "conv3", "c1"), "o.r0", "fetch_url", "digest-a")
        other_acct = await s.begin_tool_call(CallRef("did:b", "conv", "c1"), "m.r0", "fetch_url", "digest-a")
        assert other_conv.new and same_input.new and other_acct.new
        assert same_input.sealed_result is None and other_acct.sealed_result is None
        assert (await s.get_tool_call(C1)).sealed_result == b"R-conv"  # type: ignore[union-attr]


async def test_call_begun_before_a_crash_is_seen_as_interrupted(where: str, open_store: OpenStore) -> None:
    # Crash: another process begins the call and dies (os._exit) without finishing it
    # and without closing the database.
    script = (
        "import os, sys\n"
        "from gelbridge._state import CallRef, SqliteStore\n"
        "from gelbridge._state._postgres import PostgresStore\n"
        "w = sys.argv[1]\n"
        "import asyncio\n"
        "async def main():\n"
        "    s = await PostgresStore(w).open() if w.startswith('postgresql://') else SqliteStore(w)\n"
        "    await s.begin_tool_call(CallRef('did:a', 'conv', 'c9'), 'm.r0', 'mcp_x_send', 'dg')\n"
        "    os._exit(3)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, where], timeout=60)
    assert proc.returncode == 3
    s2 = await open_store().open()  # type: ignore[attr-defined]
    ref = CallRef("did:a", "conv", "c9")
    (left,) = await s2.unfinished_tool_calls("did:a")
    assert left.call_key == ref.key and left.conversation == "conv"
    entry = await s2.begin_tool_call(ref, "m.r1", "mcp_x_send", "dg")
    assert entry.interrupted and not entry.new and entry.sealed_result is None
    await s2.finish_tool_call(ref, b"sealed-interrupted", "k", True)
    assert await s2.unfinished_tool_calls("did:a") == []
    await s2.aclose()


async def test_finishing_an_unknown_call_fails_and_plaintext_type_is_refused(open_store: OpenStore) -> None:
    async with open_store() as s:
        with pytest.raises(StateError):
            await s.finish_tool_call(CallRef("did:a", "conv", "nope"), b"x", "k", False)
        await s.begin_tool_call(C1, "m.r0", "t", "d")
        with pytest.raises(TypeError):
            await s.finish_tool_call(C1, "plain text", "k", False)  # type: ignore[arg-type]


async def test_claims_lifecycle_and_crash_recovery_listing(open_store: OpenStore) -> None:
    async with open_store() as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "conv")
        await s.record_claim("did:a", "m2", 0, "m2.r0", "conv")
        await s.record_claim("did:a", "m3", 1, "m3.r1", "conv")
        await s.record_claim("did:b", "m4", 0, "m4.r0", "conv")
        again = await s.record_claim("did:a", "m1", 0, "m1.r0", "conv", status="streaming")
        assert again.status == "pending"  # idempotent: the existing claim wins
        await s.update_claim_status("did:a", "m1.r0", "streaming")
        await s.update_claim_status("did:a", "m2.r0", "complete")
        await s.update_claim_status("did:a", "m3.r1", "error", error_kind="rate_limit")
        assert [c.reply_rkey for c in await s.unfinished_claims("did:a")] == ["m1.r0"]
        assert await s.is_finished("did:a", "m2.r0") and await s.is_finished("did:a", "m3.r1")
        assert not await s.is_finished("did:a", "m1.r0") and not await s.is_finished("did:a", "missing")
        assert (await s.get_claim("did:a", "m3.r1")).error_kind == "rate_limit"  # type: ignore[union-attr]
        with pytest.raises(StateError):
            await s.update_claim_status("did:a", "missing.r0", "complete")
        with pytest.raises(StateError):  # another account's claim is not this one's
            await s.update_claim_status("did:b", "m1.r0", "complete")
        with pytest.raises(ValueError):
            await s.update_claim_status("did:a", "m1.r0", "done")  # type: ignore[arg-type]


async def test_claims_given_up_as_someone_elses_are_listed_for_the_sweep(open_store: OpenStore) -> None:
    async with open_store() as s:
        for m in ("m1", "m2", "m3", "m4"):
            await s.record_claim("did:a", m, 0, f"{m}.r0", "conv")
        await s.record_claim("did:b", "m1", 0, "m1.r0", "conv")
        await s.update_claim_status("did:a", "m1.r0", "cancelled", error_kind="claim_lost")
        await s.update_claim_status("did:a", "m2.r0", "cancelled")  # superseded: not someone else's
        await s.update_claim_status("did:a", "m3.r0", "complete", error_kind="claimed_elsewhere")
        await s.update_claim_status("did:b", "m1.r0", "cancelled", error_kind="claim_lost")
        assert [c.reply_rkey for c in await s.lost_claims("did:a", "claim_lost")] == ["m1.r0"]
        assert [c.account for c in await s.lost_claims("did:b", "claim_lost")] == ["did:b"]
        held = await s.held_claim("did:a", "m4.r0")  # unfenced: read as a write would be
        assert held is not None and held.status == "pending"
        assert await s.held_claim("did:a", "missing.r0") is None


async def test_two_accounts_sharing_a_store_have_their_own_claims_for_one_reply_key(open_store: OpenStore) -> None:
    async with open_store() as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "conv-a")
        b = await s.record_claim("did:b", "m1", 0, "m1.r0", "conv-b")
        assert (b.account, b.conversation) == ("did:b", "conv-b")
        await s.update_claim_status("did:a", "m1.r0", "complete")
        assert (await s.get_claim("did:b", "m1.r0")).status == "pending"  # type: ignore[union-attr]
        assert [c.account for c in await s.unfinished_claims("did:b")] == ["did:b"]
        assert await s.unfinished_claims("did:a") == []


async def test_a_claim_remembers_the_calls_it_wrote_and_when_it_asked_for_approval(open_store: OpenStore) -> None:
    clock = iter([100.0, 105.0, 110.0, 120.0]).__next__
    async with open_store(clock=clock) as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "conv")  # 100
        got = await s.add_calls("did:a", "m1.r0", ["d1", "d2"])  # 105: a checkpoint, not a question
        assert got.calls == {"d1", "d2"} and got.waiting_at is None
        got = await s.add_calls("did:a", "m1.r0", ["d3"], waiting=True)  # 110
        assert got.calls == {"d1", "d2", "d3"} and got.waiting_at == 110.0
        await s.update_claim_status("did:a", "m1.r0", "awaitingApproval")  # 120
        claim = await s.get_claim("did:a", "m1.r0")
        assert claim is not None and claim.calls == {"d1", "d2", "d3"} and claim.waiting_at == 110.0
        assert claim.created_at == 100.0  # first seen, on this worker's clock
        with pytest.raises(StateError):
            await s.add_calls("did:b", "m1.r0", ["d1"])


async def test_error_ring_keeps_only_labels_and_the_newest(open_store: OpenStore) -> None:
    async with open_store() as s:
        for i in range(ERRORS_KEPT + 15):
            await s.record_error("tool_error", record_key=f"m{i}.r0")
        recent = await s.recent_errors(3)
        assert [e.record_key for e in recent] == [f"m{ERRORS_KEPT + 14}.r0", f"m{ERRORS_KEPT + 13}.r0", f"m{ERRORS_KEPT + 12}.r0"]
        assert len(await s.recent_errors(10_000)) == ERRORS_KEPT
        with pytest.raises(ValueError):
            await s.record_error("the user asked about their medical results")


async def test_two_connections_see_each_other_and_do_not_double_begin(open_store: OpenStore) -> None:
    a = await open_store().open()  # type: ignore[attr-defined]
    b = await open_store().open()  # type: ignore[attr-defined]
    await a.set_cursor("src", 10)
    assert await b.get_cursor("src") == 10

    async def begin(store: StateStore) -> list[bool]:
        return [(await store.begin_tool_call(CallRef("did:a", "conv", f"c{i}"), "m.r0", "t", "d")).new
                for i in range(50)]

    results = [r for rs in await asyncio.gather(begin(a), begin(b)) for r in rs]
    assert results.count(True) == 50 and results.count(False) == 50
    await a.aclose()
    await b.aclose()


async def test_concurrent_calls_on_one_store_each_get_their_own_transaction(open_store: OpenStore) -> None:
    async with open_store() as s:
        await asyncio.gather(*(s.set_cursor(f"s{i}", i) for i in range(20)),
                             *(s.record_claim("did:a", f"m{i}", 0, f"m{i}.r0", "c") for i in range(20)))
        await s.set_cursor("direct", 1)
        assert [await s.get_cursor(f"s{i}") for i in range(20)] == list(range(20))
        assert len(await s.unfinished_claims("did:a")) == 20


async def test_seen_events_prune_by_age(open_store: OpenStore) -> None:
    now = [1000.0]
    async with open_store(clock=lambda: now[0]) as s:
        await s.mark_seen("did:a", "r1", "c1")
        now[0] = 2000.0
        await s.mark_seen("did:a", "r2", "c2")
        assert await s.prune_seen(500) == 1
        assert not await s.was_seen("did:a", "r1", "c1") and await s.was_seen("did:a", "r2", "c2")


async def test_statuses_are_enums_and_rows_read_back_as_them(open_store: OpenStore) -> None:

    async with open_store() as s:
        await s.record_claim("did:a", "m1", 0, "m1.r0", "c")
        await s.update_claim_status("did:a", "m1.r0", ReplyStatus.AWAITING_APPROVAL)
        claim = await s.get_claim("did:a", "m1.r0")
        assert claim is not None and claim.status is ReplyStatus.AWAITING_APPROVAL and claim.status == "awaitingApproval"
        entry = await s.begin_tool_call(CallRef("did:a", "c", "call-1"), "m1.r0", "t", "digest")
        assert entry.state is CallState.STARTED and entry.new and not entry.interrupted
        await s.finish_tool_call(CallRef("did:a", "c", "call-1"), b"sealed", "k1", False)
        again = await s.begin_tool_call(CallRef("did:a", "c", "call-1"), "m1.r0", "t", "digest")
        assert again.state is CallState.FINISHED and again.finished and not again.new
    with pytest.raises(ValueError, match="unknown claim status 'lost'"):
        claim_status("lost")


async def test_update_session_is_one_locked_read_modify_write(open_store: OpenStore) -> None:
    """Two workers' stores bumping one session row at once lose no update: the row is
    read under its lock (the OAuth refresh marks itself this way)."""
    async with open_store() as a, open_store() as b:
        await a.save_session("acct", {"n": 0})

        def bump(row: dict[str, object] | None) -> dict[str, object]:
            assert row is not None
            return {"n": int(str(row["n"])) + 1}

        await asyncio.gather(*(s.update_session("acct", bump) for s in (a, b) for _ in range(10)))
        assert await b.load_session("acct") == {"n": 20}
        # None: leave the row as it is, and say what it is
        assert await a.update_session("acct", lambda row: None) == {"n": 20}
        assert await a.update_session("missing", lambda row: None) is None
        assert await a.update_session("missing", lambda row: {"new": row is None}) == {"new": True}
