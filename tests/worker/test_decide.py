"""Pure worker decisions: which records ask for replies, what to do with an existing reply slot."""

from __future__ import annotations

import pytest

from gelbridge._records import MessageRecord
from gelbridge._worker.decide import ask_of, decide_existing_reply, error_message, peek_ask
from gelbridge._worker.sources import CursorTracker

MSG = "chat.gel.assistant.message"


def user(**extra: object) -> dict:
    return {
        "$type": MSG, "conversation": "3mconv", "role": "user", "createdAt": "2026-01-01T00:00:00.000Z",
        "content": {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}, **extra,
    }


def test_user_message_with_generation_asks_for_its_attempt() -> None:
    ask = ask_of(MSG, "3mabc", MessageRecord.from_value(user(generation={"attempt": 3})))
    assert ask is not None and (ask.reply_rkey, ask.attempt, ask.conversation) == ("3mabc.r3", 3, "3mconv")
    assert ask.key_id is None


@pytest.mark.parametrize("value", [user(), user(role="assistant", generation={"attempt": 0})])
def test_no_generation_or_assistant_asks_nothing(value: dict) -> None:
    assert ask_of(MSG, "3mabc", MessageRecord.from_value(value)) is None


def test_peek_ask_reads_a_malformed_request_without_raising() -> None:
    bad = user(generation={"attempt": 1}, content={"parts": "nope"})
    ask = peek_ask(MSG, "3mbad", bad)
    assert ask is not None and ask.reply_rkey == "3mbad.r1"
    assert peek_ask(MSG, "3mbad", {"role": "user", "generation": "x"}) is None
    assert peek_ask(MSG, "3mbad", user(generation={"attempt": True})) is None
    assert peek_ask(MSG, "3mbad", None) is None


@pytest.mark.parametrize("status", ["complete", "awaitingApproval", "error", "cancelled"])
def test_finished_reply_is_done_whoever_wrote_it(status: str) -> None:
    assert decide_existing_reply({"status": status}, ours=True, stale_after=1) == "done"
    assert decide_existing_reply({"status": status}, ours=False, stale_after=1) == "done"


def test_unfinished_reply_is_resumed_if_ours_left_alone_if_fresh_taken_over_if_stale() -> None:
    fresh = {"status": "streaming", "updatedAt": "2026-01-01T00:00:00.000Z"}
    now = 1767225600.0  # 2026-01-01T00:00:00Z
    assert decide_existing_reply(fresh, ours=True, stale_after=60, now=now) == "resume"
    assert decide_existing_reply(fresh, ours=False, stale_after=60, now=now + 30) == "foreign"
    assert decide_existing_reply(fresh, ours=False, stale_after=60, now=now + 61) == "takeover"
    assert decide_existing_reply(fresh, ours=False, stale_after=None, now=now + 1e6) == "foreign"


def test_error_messages_are_bounded_and_generic_for_providers() -> None:
    assert "HTTP 429" in error_message("rate_limit", status=429)
    assert error_message("bad_record", detail="x" * 5000).__len__() <= 3000


def test_cursor_tracker_saves_only_below_the_oldest_open_event() -> None:
    t = CursorTracker(10)
    for s in (11, 12, 13):
        t.begin(s)
    assert t.done(12) is None and t.safe == 10  # 11 still open
    assert t.done(11) == 12
    t.begin(14)
    t.begin(14)  # two ops of one commit
    assert t.done(14) is None
    assert t.done(13) == 13
    assert t.done(14) == 14 and t.in_flight == 0


def test_a_reply_error_kind_is_a_known_kind_and_its_message_never_someone_elses_text() -> None:
    from gelbridge._errors import AdapterError, PdsUnavailable, ProviderError, RecordError, StateError
    from gelbridge._worker.decide import REPLY_ERROR_KINDS, reply_error_kind
    from gelbridge._worker.turn import _error_of

    assert reply_error_kind("rate_limit") == "rate_limit" and reply_error_kind("decrypt_failed") == "decrypt_failed"
    assert reply_error_kind("canary says hi") == "server_error" and reply_error_kind(None) == "server_error"
    assert {"timeout", "interrupted", "bad_record", "tool_error"} <= REPLY_ERROR_KINDS
    canary = "CANARY-91d"
    cases = [
        ProviderError(f"provider body {canary}", kind=f"custom_{canary}", status=500),
        AdapterError(f"lua: attempt to index {canary}"),
        StateError(f"tool call {canary} was never begun"),
        PdsUnavailable(f"PDS said {canary}", status=502),
        RuntimeError(canary),
    ]
    for e in cases:
        kind, message = _error_of(e)
        assert kind in REPLY_ERROR_KINDS and canary not in kind and canary not in message, (e, kind, message)
    # our own record errors name keys and fields only, and stay as they are (they help the app)
    assert _error_of(RecordError("message 3mabc does not follow the lexicon")) == (
        "bad_record", "message 3mabc does not follow the lexicon")
