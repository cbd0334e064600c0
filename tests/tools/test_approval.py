"""Approval resolution (PROTOCOL.md §5) as a table of cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gelbridge._tools.approval import (
    CONFLICTING,
    EXPIRED,
    NOT_ANSWERED,
    ApprovalAnswer,
    WaitingCall,
    denial_output,
    input_digest,
    resolve_approvals,
)

A = WaitingCall("call_a", "fetch_url", '{"url": "https://example.com"}')
B = WaitingCall("call_b", "mcp_mail_send", '{"to": "x"}')
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def summary(outcome):  # (call_id, approved, cause, reason)
    return [(r.call.call_id, r.approved, r.cause, r.reason) for r in outcome.resolutions]


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (
            [ApprovalAnswer("call_a", True), ApprovalAnswer("call_b", True)],
            [("call_a", True, "user", None), ("call_b", True, "user", None)],
        ),
        (
            [ApprovalAnswer("call_a", True), ApprovalAnswer("call_b", False, "do not email anyone")],
            [("call_a", True, "user", None), ("call_b", False, "user", "do not email anyone")],
        ),
        (
            [ApprovalAnswer("call_b", False)],
            [("call_a", False, "not_answered", NOT_ANSWERED), ("call_b", False, "user", "denied by the user")],
        ),
        ([], [("call_a", False, "not_answered", NOT_ANSWERED), ("call_b", False, "not_answered", NOT_ANSWERED)]),
        (
            [ApprovalAnswer("call_a", True), ApprovalAnswer("call_a", False)],
            [("call_a", False, "conflicting", CONFLICTING), ("call_b", False, "not_answered", NOT_ANSWERED)],
        ),
    ],
    ids=["all-approved", "one-denied-with-reason", "unmentioned-denied", "no-answers", "conflicting"],
)
def test_resolution_table(answers, expected) -> None:
    assert summary(resolve_approvals([A, B], answers)) == expected


def test_answers_for_calls_not_waiting_are_ignored_and_reported() -> None:
    stray = ApprovalAnswer("call_zzz", True)
    dup = ApprovalAnswer("call_a", True, "again")
    out = resolve_approvals([A], [ApprovalAnswer("call_a", True), stray, dup])
    assert summary(out) == [("call_a", True, "user", None)]
    assert [(i.answer, i.why) for i in out.ignored] == [(stray, "not_waiting"), (dup, "duplicate")]
    assert out.approved == [A] and out.denied == []


def test_order_follows_the_parent_reply_not_the_answers() -> None:
    out = resolve_approvals([B, A], [ApprovalAnswer("call_a", True), ApprovalAnswer("call_b", True)])
    assert [r.call for r in out.resolutions] == [B, A]


@pytest.mark.parametrize(
    ("asked_at", "answered_at", "now", "approved"),
    [
        (T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=31), True),
        (T0, T0 + timedelta(seconds=61), T0 + timedelta(seconds=62), False),  # answered too late
        (T0, T0 + timedelta(seconds=10), T0 + timedelta(seconds=200), False),  # processed too late
        (None, T0, T0 + timedelta(seconds=59), True),
    ],
    ids=["in-time", "answered-late", "stale-approval", "no-question-time"],
)
def test_ttl_expiry(asked_at, answered_at, now, approved) -> None:
    out = resolve_approvals(
        [A], [ApprovalAnswer("call_a", True)], asked_at=asked_at, answered_at=answered_at, now=now, ttl=60
    )
    (r,) = out.resolutions
    assert r.approved is approved
    if not approved:
        assert (r.cause, r.reason) == ("expired", EXPIRED)


def test_without_ttl_old_approvals_stay_valid_and_denials_stay_denials() -> None:
    late = T0 + timedelta(days=30)
    out = resolve_approvals([A, B], [ApprovalAnswer("call_a", True), ApprovalAnswer("call_b", False, "no")],
                            asked_at=T0, answered_at=late, now=late)
    assert [r.approved for r in out.resolutions] == [True, False]
    out = resolve_approvals([B], [ApprovalAnswer("call_b", False, "no")], asked_at=T0, answered_at=late, now=late, ttl=1)
    assert out.resolutions[0].cause == "user"


def test_denial_outputs_name_the_reason_and_refuse_approved() -> None:
    out = resolve_approvals([A, B], [ApprovalAnswer("call_b", False, "too risky")])
    texts = [denial_output(r) for r in out.denied]
    assert "did not approve" in texts[0] and "too risky" in texts[1]
    ok = resolve_approvals([A], [ApprovalAnswer("call_a", True)]).resolutions[0]
    with pytest.raises(ValueError):
        denial_output(ok)


def test_input_digest_changes_with_tool_or_input() -> None:
    d = input_digest("t", '{"a":1}')
    assert d == input_digest("t", '{"a":1}')
    assert d != input_digest("t", '{"a":2}') and d != input_digest("u", '{"a":1}')
