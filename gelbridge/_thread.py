"""The thread of a user message: its ``parent`` chain, oldest first (PROTOCOL.md §3).

``walk_thread`` reads only record metadata (``parent``, ``conversation``, ``role``),
never content, so the caller opens just the records of the chain. Records come from a
lookup: a mapping ``rkey -> MessageRecord`` or a callable returning ``None`` for a
missing record (the worker fetches lazily from the PDS and caches).

Structural rules (docs/protocol-decisions.md, "Threads"):

- the message a reply is written for is a ``user`` message;
- a user message's ``parent`` is absent (first message) or a reply key ``K.r{n}``,
  and the record there is an ``assistant`` message;
- an assistant reply lives at a reply key ``K.r{n}`` and its ``parent`` is ``K``,
  which is a ``user`` message;
- every record of the chain belongs to the same conversation;
- no record appears twice (cycle) and the chain has at most ``max_depth`` records.

Other attempts of the same message (``K.r{m}``, m ≠ n) are not in the thread: the
user's ``parent`` picks the branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gelbridge._errors import (
    ForeignConversationError,
    MissingRecordError,
    RecordError,
    ThreadCycleError,
    ThreadError,
    ThreadTooDeepError,
)
from gelbridge._records.constants import ROLE_ASSISTANT, ROLE_USER
from gelbridge._records.keys import parse_reply_rkey
from gelbridge._records.models import MessageRecord

Lookup = Mapping[str, MessageRecord] | Callable[[str], MessageRecord | None]
"""Where the walk finds records: a mapping or a callable (``None`` = missing)."""

DEFAULT_MAX_DEPTH = 500


class ThreadEntry(NamedTuple):
    """One record of a thread and its record key (a named tuple: immutable and cheap
    to build, one per record on every turn)."""

    rkey: str
    record: MessageRecord


@dataclass(frozen=True, slots=True)
class Thread:
    """The chain of a user message, oldest first; the last entry is that message."""

    conversation: str
    entries: tuple[ThreadEntry, ...]

    @property
    def message(self) -> ThreadEntry:
        """The user message the reply is for."""
        return self.entries[-1]

    @property
    def parent_reply(self) -> ThreadEntry | None:
        """The reply the message answers (where waiting tool calls live), if any."""
        return self.entries[-2] if len(self.entries) > 1 else None

    @property
    def rkeys(self) -> list[str]:
        return [e.rkey for e in self.entries]

    def __len__(self) -> int:
        return len(self.entries)


def _getter(lookup: Lookup) -> Callable[[str], MessageRecord | None]:
    if isinstance(lookup, Mapping):
        return lookup.get
    return lookup


def walk_thread(message_rkey: str, lookup: Lookup, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Thread:
    """Walk ``parent`` links from user message ``message_rkey`` back to the first message.

    Raises MissingRecordError, ThreadCycleError, ForeignConversationError,
    ThreadTooDeepError, or RecordError for a chain that breaks the structural rules.
    Errors name record keys only, never content.
    """
    get = _getter(lookup)
    first = get(message_rkey)
    if first is None:
        err: ThreadError = MissingRecordError(f"message {message_rkey} does not exist: nothing to reply to")
        err.rkey, err.referenced_by = message_rkey, None
        raise err
    if first.role != ROLE_USER:
        raise RecordError(
            f"message {message_rkey} has role {first.role!r}: only user messages are answered"
        )
    conversation = first.conversation
    chain: list[ThreadEntry] = [ThreadEntry(message_rkey, first)]
    seen = {message_rkey}
    rkey, rec = message_rkey, first
    # The chain alternates user message -> reply -> user message ...: the first record
    # is a user message and every parent's role is checked below (so ``rec_role`` is
    # known without reading it again). A reply is always reached as a user message's
    # parent, whose key was parsed there: ``answers`` is the key of the message that
    # reply answers (each reply key is parsed once).
    rec_role = ROLE_USER
    answers = ""
    while True:
        parent = rec.parent
        if rec_role == ROLE_USER:
            if parent is None:
                break
            reply = parse_reply_rkey(parent)
            if reply is None:
                raise RecordError(
                    f"user message {rkey} names parent {parent!r}, which is not a reply key "
                    "K.r{n}: a user message answers an assistant reply"
                )
            answers = reply[0]
            expected = ROLE_ASSISTANT
        else:
            if parent != answers:
                raise RecordError(
                    f"reply {rkey} names parent {parent!r}; a reply's parent must be the "
                    f"message it answers, {answers}"
                )
            expected = ROLE_USER
        assert parent is not None
        if parent in seen:
            err = ThreadCycleError(
                f"the parent links of message {message_rkey} loop: {rkey} points back to {parent}"
            )
            err.rkey = parent
            raise err
        if len(chain) >= max_depth:
            raise ThreadTooDeepError(
                f"the thread of message {message_rkey} is longer than {max_depth} records "
                "([thread] max_depth): start a new conversation or raise the limit"
            )
        nxt = get(parent)
        if nxt is None:
            err = MissingRecordError(
                f"record {parent}, the parent of {rkey}, does not exist (deleted, or not yet "
                f"synced): the thread of {message_rkey} cannot be read"
            )
            err.rkey, err.referenced_by = parent, rkey
            raise err
        if nxt.conversation != conversation:
            raise ForeignConversationError(
                f"record {parent}, the parent of {rkey}, belongs to conversation "
                f"{nxt.conversation!r}, not {conversation!r}"
            )
        if nxt.role != expected:
            raise RecordError(
                f"record {parent}, the parent of {rkey}, has role {nxt.role!r}; expected {expected}"
            )
        seen.add(parent)
        chain.append(ThreadEntry(parent, nxt))
        rkey, rec, rec_role = parent, nxt, expected
    chain.reverse()
    return Thread(conversation, tuple(chain))


def previous_reply_rkey(message_rkey: str, message: MessageRecord) -> str | None:
    """Where the "model of the previous reply" comes from (PROTOCOL.md §4.3).

    ``K.r{n-1}`` for a regeneration (attempt n > 0), otherwise the parent reply
    (``None`` for a first message).
    """
    attempt = message.generation.attempt if message.generation is not None else 0
    if attempt > 0:
        return f"{message_rkey}.r{attempt - 1}"
    return message.parent
