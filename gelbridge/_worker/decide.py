"""Pure decisions of the worker: is a record a request for a reply, and what to do about
the reply slot ``K.r{n}`` when it already exists (PROTOCOL.md §4.1–4.2).

No I/O here: the service feeds in record values and what the PDS and the state store
said, and gets back a decision it carries out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from gelbridge._errors import REPLY_ERROR_KINDS, ProviderFault, RecordError
from gelbridge._records.constants import (
    FINAL_STATUSES,
    MESSAGE_COLLECTION,
    ROLE_USER,
    ReplyStatus,
)
from gelbridge._records.keys import reply_rkey
from gelbridge._records.models import EncryptedContent, MessageRecord
from gelbridge._records.text import is_storable


@dataclass(frozen=True, slots=True)
class Ask:
    """A user message asking for reply ``reply_rkey`` (= ``K.r{attempt}``)."""

    message_rkey: str
    attempt: int
    reply_rkey: str
    conversation: str
    key_id: str | None  # the user message's keyId (None: plain content)


def ask_of(collection: str, rkey: str, record: MessageRecord) -> Ask | None:
    """The reply a parsed record asks for, or None (not a user message with ``generation``)."""
    if collection != MESSAGE_COLLECTION or record.role != ROLE_USER or record.generation is None:
        return None
    attempt = record.generation.attempt
    key_id = record.content.key_id if isinstance(record.content, EncryptedContent) else None
    return Ask(rkey, attempt, reply_rkey(rkey, attempt), record.conversation, key_id)


def peek_ask(collection: str, rkey: str, value: Mapping[str, Any] | None) -> Ask | None:
    """Best-effort ``Ask`` of a record that failed validation (for an error reply).

    Only when the value plainly is a user message with a ``generation`` object and a
    conversation gelbridge can keep (``text.is_storable``: the claim stores it, the reply
    repeats it); never raises.
    """
    if collection != MESSAGE_COLLECTION or not isinstance(value, Mapping):
        return None
    gen = value.get("generation")
    conv = value.get("conversation")
    if value.get("role") != ROLE_USER or not isinstance(gen, Mapping) or not is_storable(conv):
        return None
    assert isinstance(conv, str)
    attempt = gen.get("attempt", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int):
        return None
    content = value.get("content")
    key_id = content.get("keyId") if isinstance(content, Mapping) else None
    try:
        return Ask(rkey, attempt, reply_rkey(rkey, attempt), conv[:512], key_id if isinstance(key_id, str) else None)
    except RecordError:
        return None


class SlotDecision(StrEnum):
    """What to do about a reply key that already holds a record (``decide_existing_reply``)."""

    DONE = "done"
    RESUME = "resume"
    FOREIGN = "foreign"
    TAKEOVER = "takeover"


class EventOutcome(StrEnum):
    """What ``Worker.handle_event`` made of one record event (for logs, stats and tests)."""

    IGNORED = "ignored"  # another account's or collection's record, or gone when read
    DELETED = "deleted"
    REPLY = "reply"  # an assistant record: nothing to answer
    SIDE_RECORD = "side-record"  # a conversation or settings record: cached for turns
    KEY_GRANT = "key-grant"  # a key grant created, updated or deleted (PROTOCOL.md §6)
    NO_GENERATION = "no-generation"  # a user message that asks for no reply
    BAD_RECORD = "bad-record"  # malformed: answered with an error reply where one can be written
    CLAIMED = "claimed"  # the reply key was claimed and its turn queued
    RESUMED = "resumed"  # an unfinished reply of ours (or a stale one) is being finished
    DONE = "done"  # its reply is already finished
    FOREIGN = "foreign"  # another worker is writing its reply
    ACTIVE = "active"  # its turn is already running here
    RACED = "raced"  # the reply appeared and vanished while claiming: the next event decides
    POSTPONED = "postponed"  # a refused final write could not be mended yet: the sweep retries


def parse_time(s: object) -> float | None:
    """An atproto datetime as epoch seconds; None when absent or not a datetime."""
    if not isinstance(s, str) or not s:
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def decide_existing_reply(
    value: Mapping[str, Any],
    *,
    ours: bool,
    stale_after: float | None,
    now: float | None = None,
) -> SlotDecision:
    """What to do when ``K.r{n}`` already exists.

    - a finished reply (complete, awaitingApproval, error, cancelled) → ``done``;
    - unfinished (pending/streaming, or an unknown status) and claimed by this worker
      (state store) → ``resume`` (rewrite it from scratch);
    - unfinished, someone else's, and not written for ``stale_after`` seconds →
      ``takeover`` (its worker is gone; the swap on its CID makes one taker win);
    - otherwise → ``foreign`` (another worker is on it: do not answer twice).
    """
    status = value.get("status") if isinstance(value, Mapping) else None
    if status in FINAL_STATUSES:
        return SlotDecision.DONE
    if ours:
        return SlotDecision.RESUME
    if stale_after is not None and status in (ReplyStatus.PENDING, ReplyStatus.STREAMING):
        at = parse_time(value.get("updatedAt")) or parse_time(value.get("createdAt"))
        now = time.time() if now is None else now
        if at is not None and now - at > stale_after:
            return SlotDecision.TAKEOVER
    return SlotDecision.FOREIGN


# --- error text for replies -------------------------------------------------------------------


_GENERIC: dict[str, str] = {
    "rate_limit": "the model provider is rate limiting requests; try again later",
    "authentication": "the model provider refused gelbridge's credentials; the operator must fix the API key",
    "invalid_request": "the model provider rejected the request",
    "server_error": "the model provider failed",
    "content_filter": "the model provider's content filter stopped the answer",
    "timeout": "the model provider did not answer in time",
    "adapter_error": "the model adapter failed",
    "interrupted": "gelbridge stopped while writing this reply; ask again to regenerate it",
    "tool_error": "a tool failed",
}


def reply_error_kind(kind: object) -> str:
    """The ``error.kind`` to write: a known kind as is; anything else (a script's or a
    provider's own word, which is unsealed text it chose) becomes ``server_error``."""
    return kind if isinstance(kind, str) and kind in REPLY_ERROR_KINDS else "server_error"


#: A 2xx stream past one of gelbridge's reading bounds (``_transport``: the ``bad_stream``
#: fault's detail; DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_EVENT_CHARS).
_UNREADABLE: dict[str, str] = {
    "LINE_TOO_LONG": "one line of its stream is longer than gelbridge reads (16 MiB)",
    "EVENT_TOO_LARGE": "one event of its stream is larger than gelbridge reads (16 MiB)",
}


def error_message(kind: str, *, detail: str | None = None, status: int | None = None,
                  fault: ProviderFault | None = None) -> str:
    """A reply ``error.message`` (≤ 3000 bytes) that never holds user content.

    ``detail`` must already be content-free (a ``GelbridgeError`` message from our own
    code names record keys only); provider messages are never passed here, because a
    provider may echo the prompt. ``fault``: a provider call's, for the few faults that
    say more than the status (a stream past gelbridge's bounds).
    """
    if not detail and fault is not None and fault.what == "bad_stream" and fault.detail in _UNREADABLE:
        detail = f"the model provider's answer could not be read: {_UNREADABLE[fault.detail]}"
    base = detail if detail else _GENERIC.get(kind, "gelbridge could not write this reply")
    if status is not None and not detail:
        base += f" (HTTP {status})"
    return base.encode("utf-8")[:2900].decode("utf-8", "ignore")
