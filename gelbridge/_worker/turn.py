"""One turn: a claimed reply ``K.r{n}`` → thread → Lux IR → model (streaming) → tools
loop → final write (PROTOCOL.md §3–§5).

:func:`run_turn` never raises for a failure of the turn itself: whatever goes wrong after
the claim ends in a final write with ``status: error`` and an ``error.kind`` (§4.6). It
re-raises only ``asyncio.CancelledError`` (after writing ``cancelled`` for a superseded
attempt or ``error``/``interrupted`` for a shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from gelbridge._config import Settings
from gelbridge._errors import (
    ClaimConflict,
    ConfigError,
    GelbridgeError,
    KeyringError,
    LeaseLost,
    PdsError,
    ProviderError,
    RecordError,
    RequestTooLargeError,
    SealingError,
    StateError,
    ThreadError,
    failure_of,
    is_refused_write,
    where_it_failed,
)
from gelbridge._mapping import (
    CallIds,
    OpenedMessage,
    OpenedRecordCache,
    ReplyDraft,
    TurnChoice,
    approval_answers,
    build_request,
    call_ids_in,
    choose_turn,
    map_finish_reason,
    map_usage,
    prompt_cache_key,
    repeated_call_parts,
    response_to_parts,
    waiting_call_parts,
    waiting_calls,
    with_results,
)
from gelbridge._observability import Metrics, log_fields
from gelbridge._records.constants import (
    CONVERSATION_COLLECTION,
    SETTINGS_COLLECTION,
    SETTINGS_RKEY,
    ReplyStatus,
)
from gelbridge._records.keys import AtUri, is_valid_rkey
from gelbridge._records.models import (
    BlobRef,
    ConversationRecord,
    FilePart,
    ImagePart,
    MessageRecord,
    ModelRef,
    Part,
    PlainContent,
    ReplyError,
    SettingsRecord,
    SourcePart,
    ToolCallPart,
    ToolResultPart,
    Usage,
)
from gelbridge._sealing import content_of, open_blob, seal_blob
from gelbridge._seams import ModelCaller, Repo
from gelbridge._state import CallRef, StateStore, TurnTiming
from gelbridge._thread import Thread, previous_reply_rkey
from gelbridge._tools import (
    Tool,
    ToolCall,
    ToolRegistry,
    call_digest,
    execute_journaled,
    needs_approval,
    resolve_approvals,
)
from gelbridge._tools.approval import ApprovalAnswer, ApprovalOutcome, WaitingCall
from gelbridge._tools.config import builtin_config
from gelbridge._tools.journal import INTERRUPTED_OUTPUT
from gelbridge._worker.decide import Ask, error_message, reply_error_kind
from gelbridge._worker.repo import RepoView, SideRecords, load_thread
from gelbridge._worker.resume import DENIED_NOT_RUN, ResumePoint, resume_point
from gelbridge._worker.timing import ReadClock, reading, start_reads, stop_reads
from gelbridge._worker.writer import CLAIMED_ELSEWHERE, ReplyWriter, content_bytes, fit_parts, size_bound
from gelbridge.lux import (
    ConversionStatus,
    Converted,
    Diagnostic,
    LuxRequest,
    LuxResponse,
    Options,
    StreamAccumulator,
    ToolKind,
)
from gelbridge.lux import Tool as LuxTool

log = logging.getLogger("gelbridge.worker.turn")

MAX_PARTS = 1000

NOT_MADE_HERE = ("The tool call was not run: it was not made by this gelbridge "
                 "(the reply holding it was written or changed by someone else).")


class CallAuthority(Protocol):
    """What this gelbridge itself did with tool calls, on its own records (never the
    client's word): calls are digests (``tools.approval.call_digest``), times epoch s."""

    async def made_here(self, reply_rkey: str) -> frozenset[str]:
        """The calls this gelbridge wrote into ``reply_rkey``."""

    async def asked(self, reply_rkey: str) -> tuple[frozenset[str], float | None]:
        """The calls ``reply_rkey`` asked approval for, and when it asked (None: it asked none)."""

    async def answered_at(self, reply_rkey: str) -> float | None:
        """When the message that ``reply_rkey`` answers was first seen."""

    async def decided_at(self, reply_rkey: str) -> float | None:
        """The moment the approvals of ``reply_rkey`` are judged (None: now)."""


class ClaimAuthority:
    """The worker's authority: its claims in the state store."""

    def __init__(self, store: StateStore, did: str) -> None:
        self.store, self.did = store, did

    async def made_here(self, reply_rkey: str) -> frozenset[str]:
        claim = await self.store.get_claim(self.did, reply_rkey)
        return claim.calls if claim is not None else frozenset()

    async def asked(self, reply_rkey: str) -> tuple[frozenset[str], float | None]:
        claim = await self.store.get_claim(self.did, reply_rkey)
        if claim is None or claim.waiting_at is None:
            return frozenset(), None
        return claim.calls, claim.waiting_at

    async def answered_at(self, reply_rkey: str) -> float | None:
        claim = await self.store.get_claim(self.did, reply_rkey)
        return claim.created_at if claim is not None else None

    async def decided_at(self, reply_rkey: str) -> float | None:
        return None  # the worker judges them as it sees them


#: Runs tool calls for a turn: ``(calls, journal key id) → results by call id``.
ToolRunner = Callable[["TurnDeps", "TurnJob", list[ToolCall], "str | None"], Awaitable[dict[str, ToolResultPart]]]


@dataclass
class TurnDeps:
    """What every turn of one account shares."""

    settings: Settings
    pds: Repo
    did: str
    keyring: Mapping[str, bytes]
    store: StateStore
    view: RepoView
    opened: OpenedRecordCache
    model: ModelCaller
    registry: ToolRegistry | None = None
    side: SideRecords | None = None  # conversation/settings records, kept current by events
    blob_cache: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    metrics: Metrics | None = None
    label: str = ""  # the account's name in metrics
    #: which calls this gelbridge made and asked about, and when (default: its claims)
    authority: CallAuthority | None = None
    #: runs approved and automatic calls (default: the registry, at most once via the journal)
    tool_runner: ToolRunner | None = None
    stream: bool = True  # stream the model's answer (progress updates)
    check_provider: bool = True  # a model whose provider is not configured ends the turn (convert: no call made)

    def calls(self) -> CallAuthority:
        if self.authority is None:
            self.authority = ClaimAuthority(self.store, self.did)
        return self.authority


@dataclass
class TurnJob:
    """A claimed reply waiting to be (or being) written."""

    ask: Ask
    writer: ReplyWriter
    received_at: float  # time.monotonic() when the event arrived
    resumed: bool = False
    resume_from: tuple[str | None, dict[str, Any]] | None = None  # the stored unfinished reply (cid, value)
    takeover: bool = False  # resume_from was left by another worker (its journal is not ours)
    upload_ms: float = 0.0  # tool-output blob uploads (PDS writes outside the writer)
    cancel_reason: str | None = None  # "superseded" | "shutdown" when cancelled
    started_at: float | None = None


class TurnOutcome(StrEnum):
    """How a turn ended (its report, timing row, span and metrics): the status its reply
    was finished with, or why the reply was not finished here."""

    COMPLETE = "complete"
    AWAITING_APPROVAL = "awaitingApproval"
    ERROR = "error"
    CANCELLED = "cancelled"
    LOST = "lost"  # someone else wrote the reply first: it is theirs
    UNFINISHED = "unfinished"  # the final write failed: the claim stays open and the sweep finishes it


@dataclass
class TurnReport:
    status: TurnOutcome
    error_kind: str | None
    timing: TurnTiming
    steps: int
    progress_writes: int = 0
    points: int = 0  # PDS write points of the reply's writes, claim included
    diagnostics: list[Diagnostic] = field(default_factory=list)  # of the turn and its last request
    output_tokens: int | None = None  # the model's, over the finished steps (None: the provider said nothing)


@dataclass
class CacheTokens:
    """The model's input tokens over a turn's steps and what the provider's prompt cache
    served (read) and took in (written): for the timing row and metrics, never records."""

    input: int | None = None
    read: int | None = None
    written: int | None = None
    output: int | None = None

    def add(self, usage: Any) -> None:
        """Add one step's Lux usage (None: the provider said nothing)."""
        if usage is None:
            return
        self.input = (self.input or 0) + max(0, int(usage.prompt_tokens))
        self.output = (self.output or 0) + max(0, int(usage.completion_tokens))
        if usage.cached_tokens is not None:
            self.read = (self.read or 0) + max(0, int(usage.cached_tokens))
        if usage.cache_creation_tokens is not None:
            self.written = (self.written or 0) + max(0, int(usage.cache_creation_tokens))


@dataclass
class TurnState:
    """What a turn knows so far; every ending (complete, error, cancelled) is written from it."""

    parts: list[Part] = field(default_factory=list)  # the reply's parts after the last finished step
    steps: int = 0
    model: ModelRef | None = None  # once chosen
    effort: str | None = None
    usage: Usage | None = None  # of the finished steps
    cache: CacheTokens = field(default_factory=CacheTokens)  # of the finished steps (not in records)
    finish: str | None = None  # the model's finish reason of the last step
    partial: Callable[[], list[Part]] | None = None  # the parts with the step in flight
    streaming: StreamAccumulator | None = None  # the step in flight (its usage is billed too)
    diagnostics: list[Diagnostic] = field(default_factory=list)  # what was lost or changed on the way
    request_diagnostics: list[Diagnostic] = field(default_factory=list)  # of building that request

    def add_usage(self, usage: Usage | None) -> None:
        """Add a finished step's usage (None: the provider said nothing)."""
        if usage is not None:
            self.usage = _sum_usage([u for u in (self.usage, usage) if u is not None])

    def parts_so_far(self) -> list[Part]:
        """The reply's parts with the step in flight (best effort: the finished steps' if
        that fails)."""
        partial = self.partial
        if partial is not None:
            try:
                return partial()
            except Exception:  # noqa: BLE001 - best effort: keep what is certain
                pass
        return list(self.parts or [])

    def usage_so_far(self) -> Usage | None:
        """The usage of the finished steps plus what the step in flight reported."""
        steps = [u for u in (self.usage,) if u is not None]
        acc = self.streaming
        if acc is not None:
            try:
                live = map_usage(acc.result().usage)
            except Exception:  # noqa: BLE001 - best effort
                live = None
            if live is not None:
                steps.append(live)
        return _sum_usage(steps) if steps else None


class _Stop(Exception):
    """End the turn with a final status other than complete (e.g. awaitingApproval)."""


class _Timer:
    def __init__(self) -> None:
        self.model_ms = 0.0
        self.reads = ReadClock()


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t is not None else None


# --- loading ------------------------------------------------------------------------------------


async def _get_side_record(deps: TurnDeps, collection: str, rkey: str,
                           cls: type[ConversationRecord] | type[SettingsRecord]) -> Any:
    """A conversation/settings record, or None if missing or malformed (logged); from the
    worker's event-fed cache when it has one (no PDS read per turn)."""
    if deps.side is not None:
        return await deps.side.get(collection, rkey)
    with reading():
        got = await deps.pds.get_record(collection, rkey)
    if got is None:
        return None
    _cid, value = got
    try:
        return cls.from_value(value, uri=str(AtUri(deps.did, collection, rkey)))
    except GelbridgeError as e:
        log.warning("%s/%s is malformed (%s); ignoring it", collection, rkey, e.kind)
        return None


async def _previous_reply(deps: TurnDeps, message_rkey: str, message: MessageRecord) -> MessageRecord | None:
    rk = previous_reply_rkey(message_rkey, message)
    if rk is None:
        return None
    entry = await deps.view.get(rk)
    if entry is None:
        return None
    cid, value = entry
    try:
        return deps.opened.record(deps.view.uri(rk), cid, value)
    except GelbridgeError:
        return None


async def _blobs_for(deps: TurnDeps, opened: list[OpenedMessage], keys: dict[str, str | None]) -> dict[str, bytes]:
    """Opened bytes of every image/file blob in the thread's user messages (best effort),
    each fetched once however many parts name it. Raises ``RequestTooLargeError`` as soon
    as they alone are more than the request may hold (every one is sent, so the request
    would be too large anyway): a thread of huge files is not read whole into memory."""
    wanted: dict[str, str] = {}
    for m in opened:
        kid = keys.get(m.rkey)
        if kid is None:
            continue
        for p in m.content.parts:
            if isinstance(p, ImagePart):
                wanted.setdefault(p.image.ref, kid)
            elif isinstance(p, FilePart) and p.extracted is not None:
                wanted.setdefault(p.extracted.text.ref, kid)
    limit = deps.settings.thread.max_request_bytes
    out: dict[str, bytes] = {}
    total = 0
    for cid, kid in wanted.items():
        data = deps.blob_cache.get(cid)
        if data is None:
            try:
                with reading():
                    body = await deps.pds.get_blob(deps.did, cid)  # at most DEFAULT_MAX_BLOB_BYTES
                    data = open_blob(body, key_id=kid, keyring=deps.keyring)
            except (GelbridgeError, KeyError) as e:
                log.info("a blob of the thread is not available (%s)", type(e).__name__)  # its ref is sealed
                continue
            keep_blob(deps.blob_cache, cid, data, 2 * limit)
        total += len(data)
        if total > limit:
            raise RequestTooLargeError.of(limit, "its files and images alone are")
        out[cid] = data
    return out


#: opened blobs an account keeps for its next turns, at most (and at most twice ``[thread]
#: max_request_bytes`` of them in all: 64 blobs of 5 MiB would be 320 MiB per account)
BLOB_CACHE_ENTRIES = 64


def keep_blob(cache: OrderedDict[str, bytes], cid: str, data: bytes, max_bytes: int) -> None:
    """Add an opened blob to an account's cache, the oldest going first past its bounds."""
    cache[cid] = data
    size = sum(map(len, cache.values()))
    while len(cache) > 1 and (len(cache) > BLOB_CACHE_ENTRIES or size > max_bytes):
        size -= len(cache.popitem(last=False)[1])


# --- tools ---------------------------------------------------------------------------------------


def native_tool_specs(settings: Settings, names: Sequence[str]) -> list[LuxTool]:
    """The provider-run tools a turn asked for and the operator allows (``web_search``):
    Lux tools of their own kind whose parameters carry the operator's options. Whether
    the provider's adapter can send one is the model client's to say (it drops it, and
    says why, when it cannot)."""
    out = []
    if "web_search" in names:
        cfg = builtin_config(settings.tools, "web_search")
        if cfg.enabled:
            out.append(LuxTool(name="web_search", kind=ToolKind.WEB_SEARCH, parameters=cfg.options(),
                               description="Search the web (run by the model provider)"))
    return out


def _journal_key(deps: TurnDeps, key_id: str | None) -> str | None:
    if key_id is not None and key_id in deps.keyring:
        return key_id
    return next(iter(sorted(deps.keyring)), None)


async def _run_tools(
    deps: TurnDeps, job: TurnJob, calls: list[ToolCall], journal_key: str | None
) -> dict[str, ToolResultPart]:
    """Run calls at most once (journal); long output goes into a sealed blob."""
    if not calls:
        return {}
    if deps.tool_runner is not None:
        return await deps.tool_runner(deps, job, calls, journal_key)
    ts = deps.settings.tools_settings
    if deps.registry is None or journal_key is None:
        return {
            c.call_id: ToolResultPart(call_id=c.call_id, output="not run: tools are not available here", is_error=True)
            for c in calls
        }

    def seal(data: bytes) -> tuple[bytes, str]:
        return seal_blob(data, key_id=journal_key, keyring=deps.keyring), journal_key

    def open_(data: bytes, kid: str) -> bytes:
        return open_blob(data, key_id=kid, keyring=deps.keyring)

    outcomes = await execute_journaled(
        calls, deps.registry, deps.store, account=deps.did, conversation=job.ask.conversation,
        reply_rkey=job.ask.reply_rkey,
        seal=seal, open_=open_, timeout=ts.call_timeout, max_output_chars=ts.max_output_chars,
    )
    results: dict[str, ToolResultPart] = {}
    for o in outcomes:
        if deps.metrics is not None:
            deps.metrics.tool_outcome(deps.label, o.is_error)
        blob: BlobRef | None = None
        key_id = job.ask.key_id
        if o.long_output is not None and key_id is not None and key_id in deps.keyring:
            data = o.long_output.encode("utf-8")
            try:
                sealed_output = seal_blob(data, key_id=key_id, keyring=deps.keyring)
                t0 = time.perf_counter()
                try:
                    ref = await deps.pds.upload_blob(sealed_output)
                finally:
                    job.upload_ms += (time.perf_counter() - t0) * 1000
                uploaded = BlobRef.from_value(ref)
                job.writer.add_blob(uploaded)
                blob = BlobRef.of(uploaded.ref, "text/plain", len(data))
            except GelbridgeError as e:
                log.warning("reply %s: a tool output blob was not uploaded (%s)", job.ask.reply_rkey, e.kind)
        results[o.call_id] = ToolResultPart(call_id=o.call_id, output=o.output, is_error=o.is_error, output_blob=blob)
    return results


# --- resuming after a crash ------------------------------------------------------------------------


def _stored_resume_point(deps: TurnDeps, job: TurnJob) -> ResumePoint | None:
    """The resume point of the unfinished reply this turn took over (None: start afresh)."""
    if not job.resumed or job.resume_from is None or not job.writer.can_write_parts:
        return None
    cid, value = job.resume_from
    uri = deps.view.uri(job.ask.reply_rkey)
    try:
        record = deps.opened.record(uri, cid, value)
        content = deps.opened.content(uri, cid, record, keyring=deps.keyring)
    except (GelbridgeError, KeyError, ValueError) as e:
        log.warning("reply %s: its stored content cannot be read (%s); writing it again from scratch",
                    job.ask.reply_rkey, type(e).__name__)
        return None
    return resume_point(content.parts)


def _cut_calls(parts: list[Part]) -> list[Part]:
    """The parts of a model step still streaming, up to its first tool call: a progress
    write never names a call before the step is complete (``worker.resume``)."""
    for i, p in enumerate(parts):
        if type(p) is ToolCallPart or type(p) is ToolResultPart:
            return parts[:i]
    return parts


def _digest(c: ToolCallPart | ToolCall | WaitingCall) -> str:
    return call_digest(c.call_id, c.tool, c.input)


async def _made_here(deps: TurnDeps, job: TurnJob) -> frozenset[str]:
    """Digests of the calls this worker wrote into the reply of ``job`` (its claim)."""
    return await deps.calls().made_here(job.ask.reply_rkey)


async def _resume_calls(
    deps: TurnDeps, job: TurnJob, point: ResumePoint, journal_key: str | None
) -> tuple[list[Part], bool]:
    """Answer the calls of a resumed reply that have no result yet (at most once).
    Returns the parts and whether calls this worker asked about still wait for approval.

    Only calls this worker wrote there (its claim) or began (its journal) are answered
    through the journal; any other call in the stored reply was written by someone else
    and never runs: after a takeover it is reported interrupted (its worker may have run
    it), otherwise as not made by gelbridge."""
    results: dict[str, ToolResultPart] = {}
    made = await _made_here(deps, job)

    async def ours(c: ToolCallPart) -> bool:
        return _digest(c) in made or await deps.store.get_tool_call(
            CallRef(deps.did, job.ask.conversation, c.call_id)) is not None

    foreign = [c for c in (*point.to_run, *point.pending) if not await ours(c)]
    if foreign:
        log.warning("reply %s: %d tool call(s) in the stored reply were not written by this gelbridge; "
                    "not running them", job.ask.reply_rkey, len(foreign))
    for c in foreign:
        output = INTERRUPTED_OUTPUT if job.takeover else NOT_MADE_HERE
        results[c.call_id] = ToolResultPart(call_id=c.call_id, output=output, is_error=True)
    calls = [ToolCall(c.call_id, c.tool, c.input, approved=(c.approval == "approved"))
             for c in point.to_run if c.call_id not in results]
    results.update(await _run_tools(deps, job, calls, journal_key))
    for c in point.denied:
        results[c.call_id] = ToolResultPart(call_id=c.call_id, output=DENIED_NOT_RUN, is_error=True)
    still_waiting = any(c.call_id not in results for c in point.pending)
    return with_results(point.parts, results), still_waiting


async def _waiting_asked_here(
    deps: TurnDeps, job: TurnJob, parent_rkey: str, waiting: list[WaitingCall]
) -> tuple[list[WaitingCall], float | None]:
    """The waiting calls of the parent reply that this worker itself asked approval for,
    and when it asked (its own clock). Any other call there (a reply written or changed
    by an app, or by a gelbridge with other state) runs nothing: it is left out and
    logged, and the answers naming it are ignored."""
    if not waiting:
        return [], None
    asked, asked_at = await deps.calls().asked(parent_rkey)
    ours = [c for c in waiting if _digest(c) in asked]
    if len(ours) < len(waiting):
        log.warning("reply %s: %d waiting call(s) in %s were not asked by this gelbridge; ignoring them",
                    job.ask.reply_rkey, len(waiting) - len(ours), parent_rkey)
    return ours, asked_at


# --- the turn -------------------------------------------------------------------------------------


async def answer(deps: TurnDeps, job: TurnJob, state: TurnState, timer: _Timer) -> ReplyStatus:
    """Everything after the claim up to (not including) the final write, in phases: load
    and open the thread and choose model and tools (:meth:`_Turn.prepare`), continue a
    reply resumed after a crash or answer the parent's approvals (:meth:`_Turn.begin`),
    then the model steps and their tool calls (:meth:`_Turn.steps`). Returns the status;
    what the turn knows so far is in ``state``, every ending is written from it."""
    turn = await _Turn.prepare(deps, job, state, timer)
    start = await turn.begin()
    return start if isinstance(start, ReplyStatus) else await turn.steps(start)


class _Loaded(NamedTuple):
    """A turn's thread, opened (the plaintext stays in memory), and its side records."""

    thread: Thread
    opened: list[OpenedMessage]
    key_ids: dict[str, str | None]  # per message: the keyId its content is sealed with (None: plain)
    previous: MessageRecord | None  # the reply this one regenerates
    conversation: ConversationRecord | None
    settings_record: SettingsRecord | None
    instructions: PlainContent | None  # the conversation's own, opened


def _refuse_plain(settings: Settings, ask: Ask) -> None:
    if ask.key_id is None and not settings.replies.allow_plain:
        raise GelbridgeError("this gelbridge answers sealed messages only ([replies] allow_plain = false): "
                             "the app must send the message as encryptedContent", kind="bad_record")


async def _load(deps: TurnDeps, ask: Ask) -> _Loaded:
    """Walk the thread, read its side records, open every message of the chain."""
    thread, cids = await load_thread(deps.view, ask.message_rkey, deps.opened, max_depth=deps.settings.thread.max_depth)
    previous, conversation, settings_record = await _side_records(deps, ask, thread)
    opened: list[OpenedMessage] = []
    key_ids: dict[str, str | None] = {}
    for e in thread.entries:
        content = deps.opened.content(deps.view.uri(e.rkey), cids.get(e.rkey), e.record, keyring=deps.keyring)
        opened.append(OpenedMessage(e.rkey, e.record, content))
        key_ids[e.rkey] = getattr(e.record.content, "key_id", None)
    instructions: PlainContent | None = None
    if conversation is not None and conversation.instructions is not None:
        instructions = content_of(conversation.instructions,
                                  uri=AtUri(deps.did, CONVERSATION_COLLECTION, thread.conversation),
                                  keyring=deps.keyring)
    return _Loaded(thread, opened, key_ids, previous, conversation, settings_record, instructions)


async def _side_records(
    deps: TurnDeps, ask: Ask, thread: Thread
) -> tuple[MessageRecord | None, ConversationRecord | None, SettingsRecord | None]:
    """The reply being regenerated, and meanwhile the conversation and settings records."""
    conv_task = (
        asyncio.create_task(_get_side_record(deps, CONVERSATION_COLLECTION, thread.conversation, ConversationRecord))
        if is_valid_rkey(thread.conversation) else None
    )
    settings_task = asyncio.create_task(_get_side_record(deps, SETTINGS_COLLECTION, SETTINGS_RKEY, SettingsRecord))
    try:
        previous = await _previous_reply(deps, ask.message_rkey, thread.message.record)
        conversation = await conv_task if conv_task is not None else None
        settings_record = await settings_task
    finally:
        for t in (conv_task, settings_task):
            if t is not None and not t.done():
                t.cancel()
    return previous, conversation, settings_record


def _choose(deps: TurnDeps, loaded: _Loaded, state: TurnState) -> tuple[TurnChoice, ModelRef]:
    """Model, tools and effort (§4.3); the model and effort go into ``state`` at once
    (every ending names them). Returns the choice and the model to ask."""
    settings = deps.settings
    choice = choose_turn(loaded.thread.message.record, previous_reply=loaded.previous,
                         conversation=loaded.conversation, settings_record=loaded.settings_record,
                         defaults=settings.defaults)
    if choice.model is None:
        raise GelbridgeError("no model chosen: the message, conversation and settings name none and "
                             "the operator set no [defaults] model")
    provider = choice.model.provider
    if deps.check_provider and provider not in settings.providers:
        raise GelbridgeError(f"model provider {provider!r} is not configured on this gelbridge",
                             kind="invalid_request")
    state.model = target = ModelRef(provider=provider, id=choice.model.id)
    state.effort = choice.effort
    return choice, target


@dataclass(slots=True, eq=False)
class _Toolbox:
    """The tools a turn offers the model: the registry's (``sources``: each one's
    ``toolCallPart.source``) and the provider-run ones (``native``)."""

    registry: ToolRegistry | None
    tools: list[Tool]
    native: list[LuxTool]
    offered: frozenset[str]
    sources: dict[str, str]

    @classmethod
    def of(cls, deps: TurnDeps, ask: Ask, names: list[str], state: TurnState) -> _Toolbox:
        """The tools ``names`` asks for; those not offered here are reported in ``state``."""
        registry = deps.registry
        tools: list[Tool] = []
        native = native_tool_specs(deps.settings, names)  # run by the provider: not in the registry
        if registry is not None and names:
            tools, unknown = registry.select(names)
            unknown = [n for n in unknown if n not in {t.name for t in native}]
            if unknown:
                log.info("reply %s: %d requested tool(s) not offered here", ask.reply_rkey, len(unknown))
                state.diagnostics += [Diagnostic(f"tools.{name}", ConversionStatus.UNSUPPORTED,
                                                 "tool not offered here") for name in unknown]
        return cls(registry, tools, native, frozenset(t.name for t in tools), {t.name: t.source for t in tools})

    def needs_approval(self, name: str) -> bool:
        # a tool not offered in this turn never runs on the model's say-so alone
        return True if self.registry is None or name not in self.offered else needs_approval(name, self.registry)

    def specs(self) -> list[Any]:
        return [t.spec() for t in self.tools] + self.native


class _Start(NamedTuple):
    """Where a turn's model steps begin: the reply's parts so far and the step to ask."""

    parts: list[Part]
    step: int = 0


class _Shared(NamedTuple):
    """What the steps of one turn share as they map the model's answers: the call ids
    taken and the urls cited so far in the reply (both grow)."""

    call_ids: CallIds
    seen_urls: set[str]


@dataclass(slots=True, eq=False)
class _Turn:
    """One turn once loaded, in phases. The turn's knowledge so far lives in ``state``
    only; everything here is fixed for the turn (``provider``/``model`` is the request's
    target, whose modelRef ``state.model`` names)."""

    deps: TurnDeps
    job: TurnJob
    state: TurnState
    timer: _Timer
    loaded: _Loaded
    choice: TurnChoice
    provider: str
    model: str
    toolbox: _Toolbox
    tool_specs: list[Any]
    journal_key: str | None
    blobs: dict[str, bytes]
    options: Options
    cache_key: str | None
    max_steps: int

    @classmethod
    async def prepare(cls, deps: TurnDeps, job: TurnJob, state: TurnState, timer: _Timer) -> _Turn:
        """Load and open the thread, choose model, tools and effort, open the files it sends."""
        ask, settings = job.ask, deps.settings
        _refuse_plain(settings, ask)
        loaded = await _load(deps, ask)
        choice, target = _choose(deps, loaded, state)
        toolbox = _Toolbox.of(deps, ask, choice.tools, state)
        journal_key = _journal_key(deps, ask.key_id)
        blobs = await _blobs_for(deps, loaded.opened, loaded.key_ids)
        d = settings.defaults
        # sealed conversations only: the key is derived from their sealing key (plain ones have none to hide)
        cache_key = (prompt_cache_key(deps.keyring[ask.key_id], deps.did, ask.conversation)
                     if ask.key_id is not None and ask.key_id in deps.keyring else None)
        return cls(deps, job, state, timer, loaded, choice, target.provider, target.id, toolbox, toolbox.specs(),
                   journal_key, blobs,
                   Options(stream=deps.stream, max_output_tokens=d.max_output_tokens, temperature=d.temperature),
                   cache_key, max(1, settings.tools_settings.max_steps))

    # --- before the first step: a resumed reply, or approval answers ---

    async def begin(self) -> _Start | ReplyStatus:
        """Where the steps start: a reply resumed after a crash that already holds tool
        calls continues from them; otherwise the reply starts with the parent's waiting
        calls, decided. A status when the turn ends here (calls still waiting)."""
        point = _stored_resume_point(self.deps, self.job)
        if point is None:  # these parts enter state.parts with the first step's (an error before it drops them)
            return _Start(await self._answer_approvals())
        log.info("reply %s: resuming after %d tool step(s) (%d call(s) without a result)",
                 self.job.ask.reply_rkey, point.steps, len(point.to_run) + len(point.denied))
        self.state.parts, still_waiting = await _resume_calls(self.deps, self.job, point, self.journal_key)
        if still_waiting:
            return ReplyStatus.AWAITING_APPROVAL
        return _Start(self.state.parts, point.steps)

    async def _answer_approvals(self) -> list[Part]:
        """Approval answers (§5): the parent's waiting calls this gelbridge asked about,
        decided, the approved ones run. Returns the parts the reply starts with."""
        ask, opened = self.job.ask, self.loaded.opened
        answers = approval_answers(opened[-1].content.parts)
        ignored = list(answers)  # unless a waiting call takes them
        parts: list[Part] = []
        parent = self.loaded.thread.parent_reply
        if parent is not None:
            parent_parts = opened[-2].content.parts
            waiting, asked_at = await _waiting_asked_here(self.deps, self.job, parent.rkey, waiting_calls(parent_parts))
            if waiting:
                outcome = await self._decide(waiting, answers, asked_at)
                ignored = [i.answer for i in outcome.ignored if i.why == "not_waiting"]
                parts = await self._run_approved(outcome, parent_parts)
        if ignored:  # count only: the call ids come from sealed content
            log.warning("reply %s: ignored %d approval answer(s) for calls not waiting in the parent",
                        ask.reply_rkey, len(ignored))
            self.state.diagnostics.append(Diagnostic(
                f"{ask.message_rkey}.approval", ConversionStatus.DEGRADED,
                f"{len(ignored)} answer(s) for calls not waiting in the parent ignored"))
        return parts

    async def _decide(self, waiting: list[WaitingCall], answers: list[ApprovalAnswer],
                      asked_at: float | None) -> ApprovalOutcome:
        calls, rkey = self.deps.calls(), self.job.ask.reply_rkey
        return resolve_approvals(
            waiting, answers,
            answered_at=_ts(await calls.answered_at(rkey)) or _now(),
            asked_at=_ts(asked_at), now=_ts(await calls.decided_at(rkey)) or _now(),
            ttl=self.deps.settings.tools_settings.approval_ttl,
        )

    async def _run_approved(self, outcome: ApprovalOutcome, parent_parts: list[Part]) -> list[Part]:
        """Run the approved calls (at most once); the parent's calls repeated with their answers."""
        approved = [ToolCall(c.call_id, c.tool, c.input, approved=True) for c in outcome.approved]
        if approved:  # this reply now holds them: a resumed turn may answer them
            await self.deps.store.add_calls(self.deps.did, self.job.ask.reply_rkey, [_digest(c) for c in approved])
        results = await _run_tools(self.deps, self.job, approved, self.journal_key)
        return repeated_call_parts(outcome, results, parent_parts=parent_parts)

    # --- the model steps ---

    async def steps(self, start: _Start) -> ReplyStatus:
        """Ask the model, run the calls it makes, ask again with their results: until it
        answers without a call, a call waits for approval, the reply is full, or
        ``[tools] max_steps`` steps are done (the last one offers no tools)."""
        parts = start.parts
        shared = _Shared(CallIds(self.job.ask.reply_rkey, self._history_ids() | call_ids_in(parts)),
                         {p.url for p in parts if type(p) is SourcePart})
        for step in range(min(start.step, self.max_steps), self.max_steps + 1):
            status = await self._step(step, parts, shared)
            if status is not None:
                return status
            parts = self.state.parts
        return ReplyStatus.COMPLETE

    def _history_ids(self) -> set[str]:
        """The call ids in the thread's messages (a generated id must be new)."""
        ids: set[str] = set()
        for m in self.loaded.opened:
            ids |= call_ids_in(m.content.parts)
        return ids

    async def _step(self, step: int, prefix: list[Part], shared: _Shared) -> ReplyStatus | None:
        """One model step after the reply's ``prefix``: its answer is kept as far as it
        fits, then its calls run. The turn's status when this step ends it."""
        self.state.steps = step + 1
        stream = _Stream.after(self, prefix, shared)
        response, full = await self._ask(self._request(step, prefix), stream)
        draft, cut = self._keep(response, full, prefix, shared)
        if full or cut:
            log.warning("reply %s: the answer outgrew one record (%d bytes of content allowed); cut there, "
                        "finishReason length", self.job.ask.reply_rkey, self.job.writer.content_budget)
            self.state.finish = "length"
            return ReplyStatus.COMPLETE
        return await self._run_calls(draft)

    def _request(self, step: int, prefix: list[Part]) -> Converted[LuxRequest]:
        return build_request(
            self.loaded.opened, provider=self.provider, model=self.model, choice=self.choice,
            instructions=self.deps.settings.defaults.instructions,
            conversation_instructions=self.loaded.instructions,
            tool_specs=self.tool_specs if step < self.max_steps else (),
            options=self.options, blobs=self.blobs, reply_prefix=prefix,
            cache_key=self.cache_key,
        )

    def parts_of(self, response: LuxResponse, call_ids: CallIds, seen_urls: set[str], after: int) -> ReplyDraft:
        """The parts of ``response``, coming after ``after`` parts of the reply."""
        return response_to_parts(
            response, provider=self.provider, model=self.model, needs_approval=self.toolbox.needs_approval,
            call_ids=call_ids, sources=self.toolbox.sources, seen_urls=seen_urls,
            max_parts=max(0, MAX_PARTS - after),
        )

    async def _ask(self, conv: Converted[LuxRequest], stream: _Stream) -> tuple[LuxResponse, bool]:
        """One model call, streamed into ``stream``: its response, and whether reading
        stopped because the answer outgrew the record."""
        state = self.state
        state.partial = stream.parts
        state.streaming = stream.acc
        state.request_diagnostics = list(conv.diagnostics)
        t0 = time.perf_counter()
        try:
            result = await self.deps.model.complete(conv.value, provider=self.provider, stream=self.deps.stream,
                                                    on_event=stream.on_event if self.deps.stream else None)
        except _ReplyFull:
            return stream.acc.result(), True
        except GelbridgeError as e:  # what the failed call lost on the way (gelbridge reply prints it)
            state.diagnostics += e.diagnostics
            raise
        finally:
            self.timer.model_ms += (time.perf_counter() - t0) * 1000
        state.diagnostics += result.diagnostics
        return result.response, False

    def _keep(self, response: LuxResponse, full: bool, prefix: list[Part],
              shared: _Shared) -> tuple[ReplyDraft, bool]:
        """The step's answer into ``state``: its parts after ``prefix`` as far as they fit
        the record (a step cut short runs no call), its usage, finish reason and losses.
        Returns its draft and whether the parts were cut."""
        state = self.state
        state.streaming = None  # kept on failure: its usage is billed (run_turn)
        draft = self.parts_of(response, shared.call_ids, shared.seen_urls, len(prefix))
        state.diagnostics += draft.diagnostics  # what the reply could not keep (left-out citations...)
        state.add_usage(draft.usage)
        state.cache.add(response.usage)
        step_parts = _cut_calls(draft.parts) if full else draft.parts
        state.parts, cut = fit_parts(prefix + step_parts, self.job.writer.content_budget)
        state.partial = None
        state.finish = draft.finish_reason
        return draft, cut

    async def _run_calls(self, draft: ReplyDraft) -> ReplyStatus | None:
        """Run the step's calls that need no approval, their results after them. The
        turn's status when it ends here, None when the model is to be asked again."""
        ask, state, writer = self.job.ask, self.state, self.job.writer
        runnable = [ToolCall(c.call_id, c.tool, c.input) for c in draft.runnable_calls]
        if runnable:
            if writer.can_write_parts:  # durable before any call begins (worker.resume)
                await self.deps.store.add_calls(self.deps.did, ask.reply_rkey,
                                                [_digest(p) for p in draft.parts if type(p) is ToolCallPart])
                await writer.checkpoint(state.parts)
            results = await _run_tools(self.deps, self.job, runnable, self.journal_key)
            state.parts, cut = fit_parts(with_results(state.parts, results), writer.content_budget)
            if cut:  # tool results outgrew the record: no further step could be written
                log.warning("reply %s: tool results outgrew one record; cut there, finishReason length",
                            ask.reply_rkey)
                state.finish = "length"
                return ReplyStatus.COMPLETE
        if draft.awaiting_approval:
            return ReplyStatus.AWAITING_APPROVAL
        if not runnable and not draft.answered_calls:  # a call answered in the mapping: the model sees why
            return ReplyStatus.COMPLETE
        if len(state.parts) >= MAX_PARTS:
            return ReplyStatus.COMPLETE
        return None


class _Stream(NamedTuple):
    """The model step in flight: its events accumulated (``acc``), the reply's parts as
    they stand now (``parts``: for progress writes and the size check; it takes no call
    id), and the hook every event goes through (``on_event``)."""

    acc: StreamAccumulator
    parts: Callable[[], list[Part]]
    on_event: Callable[[Any], None]

    @classmethod
    def after(cls, turn: _Turn, prefix: list[Part], shared: _Shared) -> _Stream:
        acc = StreamAccumulator(provider=turn.provider, model=turn.model)
        prefix = list(prefix)
        writer, reply_rkey = turn.job.writer, turn.job.ask.reply_rkey
        size = _StreamSize(min(size_bound(prefix), writer.content_budget), writer.content_budget)

        def parts() -> list[Part]:
            draft = turn.parts_of(acc.result(), CallIds(reply_rkey, shared.call_ids.used), set(shared.seen_urls),
                                  len(prefix))
            return prefix + _cut_calls(draft.parts)

        def on_event(ev: Any) -> None:  # per stream event: closures, not attribute lookups
            acc.feed(ev)
            if size.grew(ev) and content_bytes(parts()) > size.budget:
                raise _ReplyFull  # stop reading: the rest could not be written anyway
            writer.maybe_progress(parts)

        return cls(acc, parts, on_event)


class _ReplyFull(Exception):
    """The streamed answer no longer fits one record: stop reading the stream."""


class _StreamSize:
    """When to measure a streaming reply against its size budget: the characters
    streamed are counted cheaply per event, and the parts are measured exactly (JSON)
    only once that count passes half the budget, then after every further sixteenth."""

    __slots__ = ("seen", "budget", "next_check", "step")

    def __init__(self, start: int, budget: int) -> None:
        self.seen = start
        self.budget = budget
        self.step = max(4096, budget // 16)
        self.next_check = budget // 2

    def grew(self, ev: Any) -> bool:
        """Count ``ev``'s delta; True when a measurement is due."""
        d = getattr(ev, "delta", None)
        if d is None:
            return False
        n = len(getattr(d, "text", None) or getattr(d, "arguments", None) or getattr(d, "signature", None) or "")
        self.seen += n * 2 if n else 64  # JSON escapes and UTF-8 may double a character's size
        if self.seen < self.next_check:
            return False
        self.next_check = self.seen + self.step
        return True


def _sum_usage(us: list[Usage]) -> Usage:
    def s(name: str) -> int | None:
        vals = [getattr(u, name) for u in us if getattr(u, name) is not None]
        return sum(vals) if vals else None

    return Usage(input_tokens=s("input_tokens"), output_tokens=s("output_tokens"), reasoning_tokens=s("reasoning_tokens"))


#: Errors whose message is ours and names only record keys, URIs, keyIds and settings:
#: it may go into the unsealed ``error.message``. Any other error gets the generic text.
_SAFE_DETAIL = (RecordError, ThreadError, SealingError, ConfigError, KeyringError, RequestTooLargeError)


def _error_of(e: BaseException) -> tuple[str, str]:
    """``(kind, message)`` for a reply's error field; never user content (no provider
    body, no call id, no tool or script text)."""
    kind = reply_error_kind(getattr(e, "kind", None) if isinstance(e, GelbridgeError) else None)
    if isinstance(e, ProviderError):
        return kind, error_message(kind, status=e.status, fault=e.fault)
    if isinstance(e, _SAFE_DETAIL) or type(e) is GelbridgeError:  # bare GelbridgeError: raised in this module
        return kind, error_message(kind, detail=str(e))
    if isinstance(e, PdsError):
        return kind, error_message(kind, detail="the PDS failed while gelbridge answered; see the gelbridge log")
    if isinstance(e, StateError):
        return kind, error_message(kind, detail="gelbridge's state store failed; see the gelbridge log")
    if isinstance(e, GelbridgeError):
        return kind, error_message(kind)
    return "server_error", error_message("server_error", detail=f"internal error ({type(e).__name__}); see the gelbridge log")


async def run_turn(deps: TurnDeps, job: TurnJob) -> TurnReport:
    """Answer one claimed reply and write its final state."""
    start = time.monotonic()
    job.started_at = start
    queue_ms = max(0.0, (start - job.received_at) * 1000)
    timer, state, writer = _Timer(), TurnState(), job.writer
    reads_token = start_reads(timer.reads)
    try:
        ending = await _answer_to_ending(deps, job, state, timer)
    except (ClaimConflict, LeaseLost) as e:
        stop_reads(reads_token)
        lost_kind = await _lost_before_final(deps, job, e)
        return TurnReport(TurnOutcome.LOST, lost_kind,
                          await _timing(deps, job, TurnOutcome.LOST, queue_ms, start, timer, state.cache), state.steps,
                          writer.progress_writes, writer.points, output_tokens=state.cache.output)
    stop_reads(reads_token)
    outcome, error_kind = await _finish(deps, job, state, ending)
    if error_kind is not None:
        try:
            await deps.store.record_error(_label(error_kind), account=deps.did, record_key=job.ask.reply_rkey, where="turn")
        except Exception:  # noqa: BLE001
            pass
    timing = await _timing(deps, job, outcome, queue_ms, start, timer, state.cache)
    if ending.cancelled is not None:
        raise ending.cancelled
    return TurnReport(outcome, error_kind, timing, state.steps, writer.progress_writes, writer.points,
                      state.diagnostics + state.request_diagnostics, output_tokens=state.cache.output)


class _Ending(NamedTuple):
    """How a turn ended before its final write: the status and parts to write, the
    error (if any), and a cancellation to re-raise once the reply is written."""

    status: ReplyStatus
    parts: list[Part]
    error: ReplyError | None = None
    cancelled: asyncio.CancelledError | None = None

    @property
    def error_kind(self) -> str | None:
        return self.error.kind if self.error is not None else None


async def _answer_to_ending(deps: TurnDeps, job: TurnJob, state: TurnState, timer: _Timer) -> _Ending:
    """:func:`answer` within the turn deadline. Every failure becomes an error ending,
    except the reply or the lease lost (raised: nothing more is written)."""
    deadline = deps.settings.worker.turn_deadline
    turn_clock = asyncio.timeout(deadline)
    try:
        async with turn_clock:
            status = await answer(deps, job, state, timer)
    except asyncio.CancelledError as e:
        parts = state.parts_so_far()
        if job.cancel_reason == "superseded":
            return _Ending(ReplyStatus.CANCELLED, parts, cancelled=e)
        return _Ending(ReplyStatus.ERROR, parts, ReplyError(kind="interrupted", message=error_message("interrupted")),
                       cancelled=e)
    except (ClaimConflict, LeaseLost):
        raise
    except Exception as e:  # noqa: BLE001 - every failure after the claim becomes an error reply
        parts = state.parts_so_far()
        if isinstance(e, TimeoutError) and turn_clock.expired():
            error_kind, msg = "timeout", error_message("timeout", detail=(
                f"the reply took longer than gelbridge's turn deadline ({deadline:g} s, [worker] turn_deadline)"))
        else:
            error_kind, msg = _error_of(e)
        error = ReplyError(kind=error_kind, message=msg)
        log.warning("reply %s failed: %s (%s)", job.ask.reply_rkey, error_kind, failure_of(e))
        if not isinstance(e, GelbridgeError):
            log.info("reply %s: %s", job.ask.reply_rkey, where_it_failed(e))
        return _Ending(ReplyStatus.ERROR, parts, error)
    return _Ending(status, list(state.parts))


async def _lost_before_final(deps: TurnDeps, job: TurnJob, e: ClaimConflict | LeaseLost) -> str:
    """The error kind of a turn whose reply (``ClaimConflict``) or lease was lost."""
    if isinstance(e, ClaimConflict):
        log.warning("reply %s was taken over by someone else; dropping this turn", job.ask.reply_rkey)
        return await mark_lost(deps.store, deps.did, job.writer)
    log.warning("reply %s: this worker lost the account's lease; the worker that takes it over finishes it",
                job.ask.reply_rkey)
    return LeaseLost.kind


async def _finish(deps: TurnDeps, job: TurnJob, state: TurnState, ending: _Ending) -> tuple[TurnOutcome, str | None]:
    """Write the final reply of ``ending``; its outcome and the error kind to report.
    Every ending says what is known: the model (once chosen), the effort applied, the
    usage billed so far, and a finish reason ("error" for an error)."""
    writer = job.writer
    usage = state.usage_so_far()
    finish = "error" if ending.status == ReplyStatus.ERROR else map_finish_reason(state.finish)
    try:
        await _write_final(deps, job, state, ending, usage, finish)
    except ClaimConflict:
        # Someone else changed the reply since our last write (and, in a fleet, finished
        # or deleted it): it is theirs now. The claim says so (mark_lost).
        log.warning("reply %s was taken over by someone else before the final write", job.ask.reply_rkey)
        return TurnOutcome.LOST, await mark_lost(deps.store, deps.did, writer)
    except LeaseLost:  # nothing more is written: the claim stays open for the lease's new holder
        log.warning("reply %s: this worker lost the account's lease before the final write; the worker that "
                    "takes it over finishes it", job.ask.reply_rkey)
        return TurnOutcome.LOST, LeaseLost.kind
    except Exception as e:  # noqa: BLE001 - the final write failed
        if is_refused_write(e):  # never retried: the model is not asked again either
            log.error("final write of %s was refused (%s); writing a minimal error reply instead",
                      job.ask.reply_rkey, type(e).__name__)
            return await write_refused_reply(deps, writer, job.ask.reply_rkey, model=state.model,
                                             effort=state.effort, usage=usage)
        # leave the claim unfinished: recovery finishes it
        log.error("final write of %s failed (%s); it stays claimed and is finished on restart",
                  job.ask.reply_rkey, type(e).__name__)
        return TurnOutcome.UNFINISHED, "write_failed"
    return TurnOutcome(ending.status), ending.error_kind


async def _write_final(deps: TurnDeps, job: TurnJob, state: TurnState, ending: _Ending, usage: Usage | None,
                       finish: str | None) -> None:
    writer, status = job.writer, ending.status
    parts, cut = fit_parts(ending.parts if writer.can_write_parts else [], writer.content_budget)
    if cut and status == ReplyStatus.COMPLETE:
        finish = "length"
    if status == ReplyStatus.AWAITING_APPROVAL:  # before the write: only these may run on approval
        await deps.store.add_calls(deps.did, job.ask.reply_rkey,
                                   [_digest(p) for p in waiting_call_parts(parts)], waiting=True)
    final = writer.final(parts, status=status, model=state.model, effort=state.effort, usage=usage,
                         finish_reason=finish, error=ending.error)
    if ending.cancelled is not None:
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(final)), timeout=15)
    else:
        await final
    await deps.store.update_claim_status(deps.did, job.ask.reply_rkey, status, ending.error_kind)


WRITE_REFUSED = "write_refused"
REFUSED_MESSAGE = ("the reply could not be stored: the PDS refused it (too large or not a valid record); "
                   "ask again")


async def write_refused_reply(
    deps: TurnDeps, writer: ReplyWriter, reply_rkey: str, *, model: ModelRef | None = None,
    effort: str | None = None, usage: Usage | None = None,
) -> tuple[TurnOutcome, str]:
    """After the PDS refused a reply's final write for good: write a minimal error reply
    (no content). If even that fails, the claim is marked ``write_refused`` (still
    unfinished), so the recovery sweep retries this minimal write, never the turn (no
    second model call). Returns ``(status, error_kind)`` for the report."""
    try:
        await writer.final([], status=ReplyStatus.ERROR, model=model, effort=effort, usage=usage, finish_reason="error",
                           error=ReplyError(kind="server_error", message=error_message("server_error",
                                                                                      detail=REFUSED_MESSAGE)))
    except ClaimConflict:
        return TurnOutcome.LOST, await mark_lost(deps.store, deps.did, writer)
    except Exception as e:  # noqa: BLE001
        log.error("minimal error reply for %s not written either (%s); the sweep retries it", reply_rkey,
                  type(e).__name__)
        await deps.store.update_claim_status(deps.did, reply_rkey, ReplyStatus.PENDING, WRITE_REFUSED)
        return TurnOutcome.UNFINISHED, WRITE_REFUSED
    await deps.store.update_claim_status(deps.did, reply_rkey, ReplyStatus.ERROR, WRITE_REFUSED)
    return TurnOutcome.ERROR, WRITE_REFUSED


async def mark_lost(store: StateStore, did: str, writer: ReplyWriter) -> str:
    """Set the claim of a reply this worker gave up (``ClaimConflict``) from what its
    writer saw of the record (:meth:`ReplyWriter.lost_claim`); the error kind to report.
    A lease lost meanwhile leaves the claim to the worker that holds the lease now."""
    after = writer.lost_claim()
    if after is None:  # the claim is finished already
        return CLAIMED_ELSEWHERE
    try:
        await store.update_claim_status(did, writer.reply_rkey, *after)
    except LeaseLost:
        log.warning("reply %s: this worker lost the account's lease; its claim is left to the lease's holder",
                    writer.reply_rkey)
        return LeaseLost.kind
    return after[1]


def _label(s: str) -> str:
    out = "".join(c if c.isalnum() or c in "_-.:" else "_" for c in s)[:64]
    return out or "unknown"


async def _timing(deps: TurnDeps, job: TurnJob, status: TurnOutcome, queue_ms: float, start: float, timer: _Timer,
            cache: CacheTokens) -> TurnTiming:
    total_ms = (time.monotonic() - start) * 1000
    write_ms = job.writer.write_ms + job.upload_ms
    read_ms = timer.reads.ms
    bridge_ms = max(0.0, total_ms - timer.model_ms - write_ms - read_ms)
    t = TurnTiming(
        reply_rkey=job.ask.reply_rkey, account=deps.did, status=_label(status), queue_ms=queue_ms,
        bridge_ms=bridge_ms, model_ms=timer.model_ms, write_ms=write_ms, read_ms=read_ms,
        points=job.writer.points, input_tokens=cache.input, cached_tokens=cache.read,
        cache_write_tokens=cache.written,
    )
    try:
        await deps.store.record_turn(t)
        budget = getattr(deps.pds, "budget", None)
        if budget is not None and budget.remaining is not None:
            await deps.store.save_write_budget(deps.did, budget.limit, budget.remaining, budget.reset_at)
    except Exception:  # noqa: BLE001
        pass
    log_fields(log, logging.INFO, "turn {reply} {status}", reply=job.ask.reply_rkey, status=str(status),
               queue_ms=t.queue_ms, read_ms=read_ms, bridge_ms=t.bridge_ms, model_ms=t.model_ms,
               write_ms=t.write_ms, total_ms=t.total_ms, points=t.points, input_tokens=cache.input,
               cached_tokens=cache.read, cache_write_tokens=cache.written, output_tokens=cache.output,
               account=deps.label)
    return t
