"""The rows of the state store: claims, journalled tool calls, errors and turn timings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from gelbridge._records.constants import ReplyStatus

#: A claim's status is the status its reply has (or will have once written).
ClaimStatus = ReplyStatus


def claim_status(status: str) -> ReplyStatus:
    """``status`` (a record's or a row's) as a claim status; ValueError for anything else."""
    try:
        return ReplyStatus(status)
    except ValueError:
        raise ValueError(f"unknown claim status {status!r}") from None


# --- rows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A reply record key this worker claimed (create-only write) and must finish."""

    reply_rkey: str
    account: str
    message_rkey: str
    attempt: int
    conversation: str
    status: ReplyStatus
    error_kind: str | None
    created_at: float
    updated_at: float
    calls: frozenset[str] = frozenset()  # digests of the tool calls this worker wrote into the reply
    waiting_at: float | None = None  # this worker's clock when it asked for approval (add_calls)


@dataclass(frozen=True)
class CallRef:
    """Which tool call: the account, the conversation (rkey) and the call id in it."""

    account: str
    conversation: str
    call_id: str

    @property
    def key(self) -> str:
        """The journal's key for the call id (a digest: the id itself is sealed content)."""
        return call_key(self.call_id)


def call_key(call_id: str) -> str:
    return hashlib.sha256(b"gelbridge-call-id\n" + call_id.encode("utf-8", "surrogatepass")).hexdigest()


class CallState(StrEnum):
    """Where a journalled tool call is: begun (the tool may be running, or a crash cut
    it off) or finished (its sealed result is stored)."""

    STARTED = "started"
    FINISHED = "finished"


@dataclass(frozen=True)
class JournalEntry:
    """One tool call in the at-most-once journal.

    ``state`` is ``"started"`` from ``begin_tool_call`` until ``finish_tool_call``
    stores the sealed result, then ``"finished"``. ``new`` is True only on the
    ``begin_tool_call`` that created the entry: that caller (and only it) runs the tool.
    An entry returned with ``new=False`` and ``state="started"`` was begun earlier and
    never finished - the process crashed while the tool ran. The caller must not run it
    again; it reports an ``interrupted`` error result instead (and should finish the
    entry with that sealed result so later readers agree).
    """

    account: str
    conversation: str
    call_key: str
    reply_rkey: str
    tool: str
    input_digest: str
    state: CallState
    sealed_result: bytes | None
    key_id: str | None
    is_error: bool | None
    started_at: float
    finished_at: float | None
    new: bool = False

    @property
    def finished(self) -> bool:
        return self.state is CallState.FINISHED

    @property
    def interrupted(self) -> bool:
        """Begun by an earlier run and never finished."""
        return self.state is CallState.STARTED and not self.new


@dataclass(frozen=True)
class ErrorRow:
    at: float
    kind: str
    account: str | None
    record_key: str | None
    where: str | None


@dataclass(frozen=True)
class TurnTiming:
    """Milliseconds spent in each stage of one turn (for ``gelbridge status``)."""

    reply_rkey: str
    account: str
    status: str
    queue_ms: float
    bridge_ms: float
    model_ms: float
    write_ms: float
    at: float = 0.0  # set by record_turn when 0
    read_ms: float | None = None  # PDS reads inside the turn; None for turns recorded before schema v2
    points: int | None = None  # PDS write points of the reply's writes (claim, progress, final); None before v4
    #: the model's input tokens over the turn's steps, and how many of them the provider's
    #: prompt cache served and took in (None before v5, or when the provider did not say)
    input_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None

    @property
    def total_ms(self) -> float:
        return self.queue_ms + (self.read_ms or 0.0) + self.bridge_ms + self.model_ms + self.write_ms
