"""Sealed writes of one reply record ``K.r{n}``: the claim, throttled progress, the final write.

- **claim**: create-only ``putRecord`` (``swapRecord: null``), status ``pending``,
  sealed empty content (PROTOCOL.md §4.2);
- **progress**: status ``streaming`` with the parts so far, only when the parts changed
  and ``update_interval`` seconds after the previous write of the reply *landed* (the
  claim, a progress write or a checkpoint: counted from its answer, not from when it
  was sent, so two revisions an app sees are never closer than that however slow the
  PDS answers; a PDS spends write budget on each update: §4.4). Never per token.
  ``update_interval = 0`` turns progress writes off (claim + final write only);
- **checkpoint**: a ``streaming`` write *now*, whatever the throttle says, before the
  turn runs the auto-run tool calls of a model step: the stored reply then names every
  call that may be running, so a restart resumes from it (``worker.resume``) instead of
  asking the model again (which could run a tool twice). One update per tool step, also
  with ``update_interval = 0``, and the one write that may follow a progress write
  sooner than the interval (waiting would hold up the tools: docs/worker.md); the next
  progress write waits the interval from it;
- **final**: sealed parts, model, effort, usage, finishReason, status, error,
  updatedAt.

**Size.** Every write must fit one PDS request (the reference PDS takes 150 KiB of JSON;
``[replies] max_write_bytes``). :attr:`ReplyWriter.content_budget` is how many bytes of
content JSON that leaves once sealed (base64 grows it by a third); :func:`fit_parts`
cuts a list of parts to it (the turn then ends with ``finishReason: "length"``); a
progress write is cut the same way.

Every write after the claim swaps on the CID this writer last wrote, so a reply that
someone else changed (another worker took it over, the app deleted it) is never
overwritten: the write raises :class:`~gelbridge._errors.ClaimConflict` and the turn
stops. **In a fleet** the record is not the authority: the lease and the shared claim
(PostgreSQL) are. A write an earlier holder of the lease sent before it stopped may land
after this worker read the record, and this worker's next swap then fails; so a writer
given an ``authority`` (:meth:`ReplyWriter._swap`) asks it whether the reply is still
its to write, re-reads the record, and writes on from its current CID, unless the
record is gone or finished (then the reply is left as it is). That is bounded
(:data:`SWAP_RETRIES`, :data:`SWAP_RETRY_SECONDS`); past it the write fails with a
``server_error``, never a reply given up.

Content is sealed with the user message's keyId; a message the app sent as
``plainContent`` (no keyId, PROTOCOL.md §1) gets a plain reply; when the keyId is not in
the keyring (an error reply for an undecryptable message) the content is an empty
``plainContent``, which carries nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from gelbridge._errors import ClaimConflict, GelbridgeError, PdsError
from gelbridge._pds import PUT_RECORD_POINTS
from gelbridge._records.constants import (
    FINAL_STATUSES,
    MESSAGE_COLLECTION,
    ROLE_ASSISTANT,
    ReplyStatus,
)
from gelbridge._records.keys import AtUri
from gelbridge._records.models import (
    BlobRef,
    ModelRef,
    Part,
    PlainContent,
    ReasoningPart,
    ReplyError,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Usage,
    now_datetime,
)
from gelbridge._sealing import plaintext_size, seal_content
from gelbridge._worker.repo import RepoView

log = logging.getLogger("gelbridge.worker.writer")


def reply_value(
    *,
    conversation: str,
    parent: str,
    content: Mapping[str, Any],
    status: ReplyStatus,
    created_at: str,
    updated_at: str | None = None,
    model: ModelRef | None = None,
    effort: str | None = None,
    usage: Usage | None = None,
    finish_reason: str | None = None,
    error: ReplyError | None = None,
) -> dict[str, Any]:
    """The JSON form of a reply record (pure)."""
    v: dict[str, Any] = {
        "$type": MESSAGE_COLLECTION,
        "conversation": conversation,
        "role": ROLE_ASSISTANT,
        "parent": parent,
        "content": dict(content),
        "status": str(status),  # the plain wire string: record values hold JSON types only
        "createdAt": created_at,
    }
    if updated_at is not None:
        v["updatedAt"] = updated_at
    if model is not None:
        v["model"] = model.to_value()
    if effort is not None:
        v["effort"] = effort
    if usage is not None:
        v["usage"] = usage.to_value()
    if finish_reason is not None:
        v["finishReason"] = finish_reason
    if error is not None:
        v["error"] = error.to_value()
    return v


#: Room a reply record needs besides its content: the other fields, the putRecord
#: envelope, the sealed-content wrapper (generous: these are a few hundred bytes).
RECORD_OVERHEAD_BYTES = 4096


def content_budget(max_write_bytes: int) -> int:
    """Bytes of content JSON that fit a write of ``max_write_bytes`` once sealed
    (16-byte tag, base64 in the request JSON) with the rest of the record beside it."""
    return max(0, (max_write_bytes - RECORD_OVERHEAD_BYTES) * 3 // 4 - 16)


def content_bytes(parts: Sequence[Part]) -> int:
    """Size of the content JSON of ``parts`` (what is sealed)."""
    return plaintext_size(PlainContent(parts=list(parts)))


def size_bound(parts: Sequence[Part]) -> int:
    """A cheap upper bound of :func:`content_bytes`: every character of a string field
    counted as 6 bytes (a JSON ``\\u`` escape; UTF-8 takes at most 4), every other field
    and part as 512. Parts with extra fields count as the budget of a whole write."""
    n = 64
    for p in parts:
        if p.__pydantic_extra__:
            return 1 << 40
        n += 64
        for v in p.__dict__.values():
            n += 6 * len(v) + 16 if type(v) is str else 512
    return n


def fit_parts(parts: Sequence[Part], budget: int) -> tuple[list[Part], bool]:
    """``parts`` cut to at most ``budget`` bytes of content JSON, and whether anything
    was cut (pure). Parts are dropped from the end; the last one kept, if it is text or
    reasoning, is shortened to what fits (whole characters)."""
    out = list(parts)
    if size_bound(out) <= budget or content_bytes(out) <= budget:
        return out, False
    while out and content_bytes(out) > budget:
        last = out.pop()
        if type(last) is ToolResultPart and out and type(out[-1]) is ToolCallPart and out[-1].call_id == last.call_id:
            out.pop()  # a call goes with its result (PROTOCOL.md §5): never one without the other
            continue
        if (type(last) is TextPart or type(last) is ReasoningPart) and last.text:
            text = last.text
            lo, hi = 0, len(text)  # the longest prefix that fits: binary search
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if content_bytes([*out, last.model_copy(update={"text": text[:mid]})]) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            if lo > 0:
                out.append(last.model_copy(update={"text": text[:lo]}))
                break
    return out, True


#: Progress updates come ``SPACING`` times less often once a write budget (the account's
#: PDS points, the relay's per-host events) is ``SPACE_OUT_AT`` used, and stop at ``SKIP_AT``.
SPACE_OUT_AT, SKIP_AT, SPACING = 0.5, 0.8, 4.0


def progress_gap(interval: float, pds: Any, reserve_points: int) -> float | None:
    """Seconds between progress updates now, or None to skip them: the one policy for
    spending write budgets on previews (claims and final writes are never skipped)."""
    budget = getattr(pds, "budget", None)
    relay = getattr(pds, "relay", None)
    if budget is not None and budget.low(reserve_points):
        return None
    used = max(budget.pressure() if budget is not None else 0.0, relay.pressure() if relay is not None else 0.0)
    if used >= SKIP_AT:
        return None
    return interval * SPACING if used >= SPACE_OUT_AT else interval


#: A swap that fails on a reply this worker still holds (its ``authority`` says so) is
#: retried on the re-read record at most this many times, and within this many seconds.
SWAP_RETRIES = 3
SWAP_RETRY_SECONDS = 10.0

#: What a lost reply's claim is set to, by what the writer last saw of the record
#: (:meth:`ReplyWriter.lost_claim`).
CLAIM_LOST = "claim_lost"  # changed by someone else and not finished: the sweep looks at it again
CLAIMED_ELSEWHERE = "claimed_elsewhere"  # finished by someone else
REPLY_DELETED = "reply_deleted"

#: ``() -> bool``: may this worker still write the reply, whatever its record says (in a
#: fleet: its lease, checked in the database, and the shared claim not finished)? False
#: when the claim is finished or gone; raises ``LeaseLost`` when the lease is.
Authority = Callable[[], Awaitable[bool]]


def claim_authority(store: Any, did: str, reply_rkey: str) -> Authority:
    """The :data:`Authority` of a fleet's worker over one reply: the shared claim on it is
    not finished, read through the account's fence (``StateStore.held_claim``: in a
    fleet, ``LeaseLost`` unless this worker's lease is current in the database)."""

    async def still_ours() -> bool:
        claim = await store.held_claim(did, reply_rkey)
        return claim is not None and claim.status not in FINAL_STATUSES

    return still_ours


class ReplyWriter:
    """Writes one reply record; serialises its writes and tracks the CID to swap on."""

    def __init__(
        self,
        pds: Any,  # gelbridge._pds.PdsClient
        view: RepoView,
        *,
        reply_rkey: str,
        message_rkey: str,
        conversation: str,
        key_id: str | None,
        keyring: Mapping[str, bytes],
        update_interval: float = 2.0,
        max_write_bytes: int = 150 * 1024,
        reserve_points: int = 100,
        created_at: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        authority: Authority | None = None,
    ) -> None:
        self.pds = pds
        self.view = view
        self.reply_rkey = reply_rkey
        self.message_rkey = message_rkey
        self.conversation = conversation
        self.key_id = key_id
        self.keyring = keyring
        self.update_interval = update_interval
        self.content_budget = content_budget(max_write_bytes)
        self.reserve_points = reserve_points
        self.created_at = created_at or now_datetime()
        self.uri = AtUri(view.did, MESSAGE_COLLECTION, reply_rkey)
        self.cid: str | None = None
        self.status: str | None = None
        self.blobs: list[BlobRef] = []
        self.claim_ms = 0.0  # the claim write (before the turn starts)
        self.write_ms = 0.0  # awaited writes inside the turn (settling progress, final)
        self.progress_writes = 0
        self.writes = 0  # record writes that landed (claim, progress, checkpoints, final)
        self.checkpoints = 0
        self.lost = False  # someone else changed the record: stop writing
        #: None: a failed swap means the reply is someone else's; else it is asked (a fleet)
        self.authority = authority
        self.swap_retries = 0  # writes done again on a re-read record (a fleet's late writes)
        #: what the record held when this writer gave it up: a final status, "deleted",
        #: or None (changed, or not read again)
        self.lost_to: str | None = None
        self._claim_done = False  # the authority said the claim is finished: leave it
        self._clock = clock
        self._lock = asyncio.Lock()
        self._last_write = clock()  # when the last write of this reply landed (or this writer was made)
        self._progress_task: asyncio.Task[None] | None = None
        self._last_parts: list[Part] | None = None
        # when parts are next built for a progress check: not before an interval after a
        # build that found nothing new (else every later event rebuilt them, 40,000 times
        # for an answer citing 40,000 pages, blocking the event loop for minutes)
        self._next_build = 0.0

    # --- content -------------------------------------------------------------------------

    @property
    def can_write_parts(self) -> bool:
        """Whether parts can go into this reply: plain (the message was plain) or sealed
        with a key in the keyring."""
        return self.key_id is None or self.key_id in self.keyring

    def content(self, parts: Sequence[Part]) -> dict[str, Any]:
        """Sealed content; plain for a plain message; empty plain content when the key
        is unavailable."""
        if self.key_id is None:
            return PlainContent(parts=list(parts)).to_value()
        if self.key_id not in self.keyring:
            if parts:
                raise GelbridgeError(
                    f"reply {self.reply_rkey}: cannot seal content, key {self.key_id!r} is not in the keyring"
                )
            return PlainContent(parts=[]).to_value()
        enc = seal_content(PlainContent(parts=list(parts)), uri=self.uri, key_id=self.key_id, keyring=self.keyring)
        if self.blobs:
            enc = enc.model_copy(update={"blobs": list(self.blobs)})
        return enc.to_value()

    def add_blob(self, ref: BlobRef) -> None:
        """Keep an uploaded (encrypted) blob referenced from the record (§2)."""
        self.blobs.append(ref)

    # --- writes --------------------------------------------------------------------------------

    async def _put(self, value: dict[str, Any], *, swap: str | None, must_land: bool = False) -> None:
        if must_land:  # the claim and the final write wait out a spent write budget
            res = await self.pds.put_record(MESSAGE_COLLECTION, self.reply_rkey, value, swap_record=swap,
                                            must_land=True)
        else:
            res = await self.pds.put_record(MESSAGE_COLLECTION, self.reply_rkey, value, swap_record=swap)
        self.writes += 1
        self._last_write = self._clock()  # landed: the next progress write waits from here
        self.cid = res.cid
        self.status = value["status"]
        self.view.put(self.reply_rkey, res.cid, value)

    async def _swap(self, value: dict[str, Any], *, must_land: bool = False) -> None:
        """Write ``value`` swapping on the CID last written (under the lock). A failed swap
        raises :class:`ClaimConflict`, unless this worker still holds the reply (its
        ``authority``): then the record is read again and, when it is neither gone nor
        finished, written on from its current CID (bounded; past the bound, a
        ``server_error``)."""
        deadline: float | None = None  # from the first failed swap (a must_land write may wait long before)
        tries = 0
        while True:
            try:
                await self._put(value, swap=self.cid, must_land=must_land)
                return
            except ClaimConflict:
                if self.authority is None:
                    raise
            deadline = deadline if deadline is not None else time.monotonic() + SWAP_RETRY_SECONDS
            if tries == SWAP_RETRIES or time.monotonic() > deadline:
                raise self._unresolved(tries)
            tries += 1
            await self._take_current()

    async def _take_current(self) -> None:
        """After a failed swap on a reply this worker holds: swap next on the record's
        current CID, or raise ClaimConflict when the reply is finished or gone (it is left
        as it is). The record's content is never logged."""
        assert self.authority is not None
        if not await self.authority():
            self._claim_done = True
            raise ClaimConflict(f"reply {self.reply_rkey}: its claim is finished; not writing it again")
        try:
            entry = await self.view.get(self.reply_rkey, fresh=True)
        except PdsError as e:  # counted as a try: the next one reads again
            log.warning("reply %s: re-reading it after a failed swap failed (%s)", self.reply_rkey, type(e).__name__)
            await asyncio.sleep(0.2)
            return
        if entry is None:
            self.lost_to = "deleted"
            raise ClaimConflict(f"reply {self.reply_rkey} was deleted; not writing it again")
        status = entry[1].get("status")
        if status in FINAL_STATUSES:
            self.lost_to = str(status)
            raise ClaimConflict(f"reply {self.reply_rkey} was finished by someone else; not overwriting it")
        log.warning("reply %s changed under this worker's write, which still holds its claim (a late write "
                    "of an earlier holder?): writing on from its current version", self.reply_rkey)
        self.cid = entry[0]
        self.swap_retries += 1

    def _unresolved(self, tries: int) -> GelbridgeError:
        log.error("reply %s: still no write after %d re-read(s) of its record; giving up this write",
                  self.reply_rkey, tries)
        return GelbridgeError(f"reply {self.reply_rkey} kept changing while gelbridge wrote it "
                              f"({tries} re-read(s) of the record); ask again", kind="server_error")

    def lost_claim(self) -> tuple[ReplyStatus, str] | None:
        """The claim's status and error kind for a reply this writer gave up (ClaimConflict),
        or None to leave the claim as it is (it is finished already)."""
        if self._claim_done:
            return None
        if self.lost_to == "deleted":
            return ReplyStatus.CANCELLED, REPLY_DELETED
        if self.lost_to in FINAL_STATUSES:
            return ReplyStatus(self.lost_to), CLAIMED_ELSEWHERE
        return ReplyStatus.CANCELLED, CLAIM_LOST

    @property
    def points(self) -> int:
        """PDS write points this reply's writes cost (putRecord: 2 each, every update counted)."""
        return PUT_RECORD_POINTS * self.writes

    async def claim(self) -> None:
        """Create-only write of the pending reply. Raises ClaimConflict if it exists."""
        value = reply_value(
            conversation=self.conversation, parent=self.message_rkey, content=self.content([]),
            status=ReplyStatus.PENDING, created_at=self.created_at,
        )
        t0 = time.perf_counter()
        async with self._lock:
            await self._put(value, swap=None, must_land=True)
        self.claim_ms += (time.perf_counter() - t0) * 1000

    def adopt(self, cid: str | None, value: Mapping[str, Any]) -> None:
        """Take over an existing record (resume after a crash, or a stale claim)."""
        self.cid = cid
        self.status = value.get("status") if isinstance(value.get("status"), str) else None
        created = value.get("createdAt")
        if isinstance(created, str) and created:
            self.created_at = created

    def maybe_progress(self, build_parts: Callable[[], list[Part]]) -> None:
        """Schedule a ``streaming`` update if one is due (never blocks, never per token)."""
        if self.update_interval <= 0 or self.lost:
            return
        now = self._clock()  # called per stream event: the cheap test first (a gap is never shorter)
        if now - self._last_write < self.update_interval or now < self._next_build:
            return
        gap = progress_gap(self.update_interval, self.pds, self.reserve_points)
        if gap is None or now - self._last_write < gap:
            return  # a write budget runs low: keep it for claims and final writes
        if self._progress_task is not None and not self._progress_task.done():
            return  # still in flight: the gap counts from when it lands
        parts = build_parts()
        if not parts or (self._last_parts is not None and parts == self._last_parts):
            self._next_build = now + self.update_interval
            return
        self._last_parts = parts
        self._progress_task = asyncio.create_task(self._progress(parts), name=f"progress {self.reply_rkey}")

    async def _progress(self, parts: list[Part]) -> None:
        try:
            parts, _ = fit_parts(parts, self.content_budget)  # a progress write is a preview: cut quietly
            value = reply_value(
                conversation=self.conversation, parent=self.message_rkey, content=self.content(parts),
                status=ReplyStatus.STREAMING, created_at=self.created_at, updated_at=now_datetime(),
            )
            async with self._lock:
                if self.lost:
                    return
                await self._swap(value)
            self.progress_writes += 1
        except ClaimConflict:
            self.lost = True
            log.warning("reply %s changed under us; no more writes to it", self.reply_rkey)
        except Exception as e:  # noqa: BLE001 - a failed progress write is not fatal: the final write decides
            log.info("progress write of %s failed (%s)", self.reply_rkey, type(e).__name__)

    async def checkpoint(self, parts: Sequence[Part]) -> None:
        """A durable ``streaming`` write of ``parts`` now (not throttled), after any
        progress write in flight (so an older one never lands after it). Raises
        ClaimConflict if the record was changed by someone else, and the PDS error if
        the write failed: the caller must not run the tools then."""
        await self.settle()
        if self.lost:
            raise ClaimConflict(f"reply {self.reply_rkey} was changed by someone else; not overwriting it")
        value = reply_value(
            conversation=self.conversation, parent=self.message_rkey, content=self.content(parts),
            status=ReplyStatus.STREAMING, created_at=self.created_at, updated_at=now_datetime(),
        )
        t0 = time.perf_counter()
        try:
            async with self._lock:
                await self._swap(value)
        except ClaimConflict:
            self.lost = True
            raise
        finally:
            self.write_ms += (time.perf_counter() - t0) * 1000
        self.progress_writes += 1
        self.checkpoints += 1
        self._last_parts = list(parts)

    async def settle(self) -> None:
        """Wait for an in-flight progress write (before the final write)."""
        task, self._progress_task = self._progress_task, None
        if task is not None and not task.done():
            t0 = time.perf_counter()
            try:
                await task
            finally:
                self.write_ms += (time.perf_counter() - t0) * 1000

    async def final(
        self,
        parts: Sequence[Part],
        *,
        status: ReplyStatus,
        model: ModelRef | None = None,
        effort: str | None = None,
        usage: Usage | None = None,
        finish_reason: str | None = None,
        error: ReplyError | None = None,
    ) -> None:
        """The last write of the reply (swap on the CID last written)."""
        await self.settle()
        if self.lost:
            raise ClaimConflict(f"reply {self.reply_rkey} was changed by someone else; not overwriting it")
        value = reply_value(
            conversation=self.conversation, parent=self.message_rkey, content=self.content(parts),
            status=status, created_at=self.created_at, updated_at=now_datetime(), model=model,
            effort=effort, usage=usage, finish_reason=finish_reason, error=error,
        )
        t0 = time.perf_counter()
        try:
            async with self._lock:
                await self._swap(value, must_land=True)
        except ClaimConflict:
            self.lost = True
            raise
        finally:
            self.write_ms += (time.perf_counter() - t0) * 1000
