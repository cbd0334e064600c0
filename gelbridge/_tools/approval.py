"""Approval resolution (PROTOCOL.md §5) as pure functions.

Inputs are plain dataclasses, not record models, so this module does not depend on the
records package; the thread mapping adapts records to them:

- ``WaitingCall``: a ``toolCallPart`` of the parent reply with ``approval: "pending"``
  and no ``toolResultPart``.
- ``ApprovalAnswer``: a ``toolApprovalPart`` of the user's answering message.

Rules:
- A waiting call with an ``approved: true`` answer is approved; ``approved: false`` is
  denied with the user's reason.
- A waiting call the answer does not mention is denied ("not answered").
- Answers naming calls that are not waiting in the parent are ignored (and reported).
- Several answers for one call: if they agree, the first counts and the rest are
  ignored as duplicates; if they disagree the call is denied (the safe reading).
- With ``approval_ttl`` set, an approval is void ("approval expired") when the answer
  was written more than ``ttl`` seconds after the question, or when it is processed
  more than ``ttl`` seconds after it was written (a worker that was down for a day
  must not act on day-old consent). Denials stay denials.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Cause = Literal["user", "not_answered", "expired", "conflicting"]


@dataclass(frozen=True)
class WaitingCall:
    call_id: str
    tool: str
    input: str  # JSON-encoded arguments, as in the record
    source: str = ""


@dataclass(frozen=True)
class ApprovalAnswer:
    call_id: str
    approved: bool
    reason: str | None = None


@dataclass(frozen=True)
class Resolution:
    """The fate of one waiting call. ``reason`` is set for every denial."""

    call: WaitingCall
    approved: bool
    cause: Cause
    reason: str | None = None


@dataclass(frozen=True)
class IgnoredAnswer:
    answer: ApprovalAnswer
    why: Literal["not_waiting", "duplicate"]


@dataclass(frozen=True)
class ApprovalOutcome:
    resolutions: list[Resolution]  # one per waiting call, in the parent's order
    ignored: list[IgnoredAnswer]

    @property
    def approved(self) -> list[WaitingCall]:
        return [r.call for r in self.resolutions if r.approved]

    @property
    def denied(self) -> list[Resolution]:
        return [r for r in self.resolutions if not r.approved]


NOT_ANSWERED = "not answered"
EXPIRED = "approval expired"
CONFLICTING = "conflicting answers"


def _expired(
    ttl: float | None, asked_at: datetime | None, answered_at: datetime | None, now: datetime | None
) -> bool:
    if ttl is None or answered_at is None:
        return False
    if asked_at is not None and (answered_at - asked_at).total_seconds() > ttl:
        return True
    return now is not None and (now - answered_at).total_seconds() > ttl


def resolve_approvals(
    waiting: list[WaitingCall],
    answers: list[ApprovalAnswer],
    *,
    answered_at: datetime | None = None,
    asked_at: datetime | None = None,
    now: datetime | None = None,
    ttl: float | None = None,
) -> ApprovalOutcome:
    """Decide every waiting call. ``answered_at`` is the approval message's
    ``createdAt``, ``asked_at`` the waiting reply's ``updatedAt``/``createdAt``, ``now``
    the processing time; all timezone-aware."""
    waiting_ids = {c.call_id for c in waiting}
    by_call: dict[str, list[ApprovalAnswer]] = {}
    ignored: list[IgnoredAnswer] = []
    for a in answers:
        if a.call_id not in waiting_ids:
            ignored.append(IgnoredAnswer(a, "not_waiting"))
            continue
        by_call.setdefault(a.call_id, []).append(a)
    expired = _expired(ttl, asked_at, answered_at, now)
    resolutions: list[Resolution] = []
    seen: set[str] = set()
    for call in waiting:
        if call.call_id in seen:  # a malformed parent listing one call twice
            continue
        seen.add(call.call_id)
        given = by_call.get(call.call_id, [])
        if not given:
            resolutions.append(Resolution(call, False, "not_answered", NOT_ANSWERED))
            continue
        first = given[0]
        if any(a.approved != first.approved for a in given[1:]):
            resolutions.append(Resolution(call, False, "conflicting", CONFLICTING))
            continue
        ignored.extend(IgnoredAnswer(a, "duplicate") for a in given[1:])
        if not first.approved:
            resolutions.append(Resolution(call, False, "user", first.reason or "denied by the user"))
        elif expired:
            resolutions.append(Resolution(call, False, "expired", EXPIRED))
        else:
            resolutions.append(Resolution(call, True, "user", first.reason))
    return ApprovalOutcome(resolutions, ignored)


def denial_output(resolution: Resolution) -> str:
    """The ``toolResultPart.output`` (with ``isError: true``) for a denied call: short,
    and phrased so the model does not mistake it for the tool's answer."""
    if resolution.approved:
        raise ValueError("denial_output is for denied calls")
    if resolution.cause == "user":
        return f"The user denied this tool call. Reason: {resolution.reason}"
    if resolution.cause == "expired":
        return "The tool call was not run: the user's approval expired."
    if resolution.cause == "conflicting":
        return "The tool call was not run: the user's answers about it contradicted each other."
    return "The tool call was not run: the user did not approve it."


def input_digest(tool: str, input_json: str) -> str:
    """A stable digest of a call (tool + exact input text) for the tool journal, so a
    reused call id with an edited input is detected."""
    return hashlib.sha256(f"{tool}\n{input_json}".encode()).hexdigest()


def call_digest(call_id: str, tool: str, input_json: str) -> str:
    """Names one call (id, tool, exact input) without its content: what a claim
    remembers of the calls gelbridge itself wrote into a reply (``StateStore.add_calls``)."""
    idh = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return hashlib.sha256(f"{idh}\n{input_digest(tool, input_json)}".encode()).hexdigest()
