"""Lux IR stream events and the accumulator that folds them into a response.

Index rule: a block ``index`` is unique within one stream and never reused for
another block (producers number blocks 0, 1, 2, ... in the order they start). The
accumulator orders blocks by the first event that names them. ``item_index`` on
``block_start`` (an extension) optionally says which item the block belongs to;
item indices are a separate namespace.

Wire form: ``{"event": <name>, ...}`` as in the schema, plus the deltas ``native``
and ``provider_data`` (see docs/lux-ir.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gelbridge.lux._diagnostics import ConversionStatus, Diagnostic
from gelbridge.lux._errors import LuxDecodeError
from gelbridge.lux._models import (
    _FINISH,
    Annotation,
    Choice,
    Content,
    FinishReason,
    LuxError,
    LuxResponse,
    Message,
    ProviderData,
    Refusal,
    Role,
    Text,
    Thinking,
    ToolUse,
    Usage,
    _Decoder,
    native_json,
)

# --- deltas ---------------------------------------------------------------------------


@dataclass(slots=True)
class TextDelta:
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass(slots=True)
class ThinkingDelta:
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "thinking", "text": self.text}


@dataclass(slots=True)
class SignatureDelta:
    """A piece of a thinking signature (appended, as Anthropic sends it)."""

    signature: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "signature", "signature": self.signature}


@dataclass(slots=True)
class ToolArgumentsDelta:
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "tool_arguments", "arguments": self.arguments}


@dataclass(slots=True)
class RefusalDelta:
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "refusal", "text": self.text}


@dataclass(slots=True)
class NativeDelta:
    tag: str
    payload: Any = None

    def to_json(self) -> dict[str, Any]:
        return native_json(self.tag, self.payload)


@dataclass(slots=True)
class ProviderDataDelta:
    """Opaque provider state for the block (gelbridge extension).

    ``provider_data.data`` is merged key by key into the block's provider data
    (same provider+model). ``redacted=True`` marks a thinking block as redacted
    (Anthropic ``redacted_thinking``: put its ``data`` in ``provider_data.data``).
    Gemini ``thoughtSignature``, OpenAI ``encrypted_content`` travel the same way.
    """

    provider_data: ProviderData
    redacted: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "provider_data", "provider_data": self.provider_data.to_json()}
        if self.redacted:
            out["redacted"] = True
        return out


Delta = (TextDelta | ThinkingDelta | SignatureDelta | ToolArgumentsDelta | RefusalDelta
         | NativeDelta | ProviderDataDelta)

# --- events ---------------------------------------------------------------------------


@dataclass(slots=True)
class ConversationMeta:
    id: str | None = None
    model: str | None = None
    usage_input: int | None = None
    created_at: int | None = None
    extra: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in ("id", "model", "usage_input", "created_at", "extra"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


@dataclass(slots=True)
class ConversationStart:
    meta: ConversationMeta = field(default_factory=ConversationMeta)

    def to_json(self) -> dict[str, Any]:
        return {"event": "conversation_start", "meta": self.meta.to_json()}


@dataclass(slots=True)
class ItemStart:
    """An item begins. ``item`` is the raw conversation-item JSON (a skeleton); the
    accumulator takes content only from blocks."""

    index: int
    item: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"event": "item_start", "index": self.index, "item": self.item}


@dataclass(slots=True)
class ToolCallStart:
    id: str
    name: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "tool_call", "id": self.id, "name": self.name}


@dataclass(slots=True)
class BlockStart:
    """``block_type``: text | thinking | refusal | image | audio | video | native tag,
    or ``ToolCallStart``."""

    index: int
    block_type: str | ToolCallStart
    item_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        bt = self.block_type
        out: dict[str, Any] = {"event": "block_start", "index": self.index,
                               "block_type": bt.to_json() if isinstance(bt, ToolCallStart) else bt}
        if self.item_index is not None:
            out["item_index"] = self.item_index
        return out


@dataclass(slots=True)
class BlockDelta:
    index: int
    delta: Delta

    def to_json(self) -> dict[str, Any]:
        return {"event": "block_delta", "index": self.index, "delta": self.delta.to_json()}


@dataclass(slots=True)
class BlockEnd:
    index: int

    def to_json(self) -> dict[str, Any]:
        return {"event": "block_end", "index": self.index}


@dataclass(slots=True)
class ItemEnd:
    index: int

    def to_json(self) -> dict[str, Any]:
        return {"event": "item_end", "index": self.index}


@dataclass(slots=True)
class BlockDiscard:
    """Throw away what the block has accumulated so far (later deltas refill it)."""

    index: int

    def to_json(self) -> dict[str, Any]:
        return {"event": "block_discard", "index": self.index}


@dataclass(slots=True)
class AnnotationsEvent:
    index: int
    annotations: list[Annotation]

    def to_json(self) -> dict[str, Any]:
        return {"event": "annotations", "index": self.index,
                "annotations": [a.to_json() for a in self.annotations]}


@dataclass(slots=True)
class FinishEvent:
    finish_reason: str

    def to_json(self) -> dict[str, Any]:
        return {"event": "finish", "finish_reason": self.finish_reason}


@dataclass(slots=True)
class UsageEvent:
    usage: Usage

    def to_json(self) -> dict[str, Any]:
        return {"event": "usage", "usage": self.usage.to_json()}


@dataclass(slots=True)
class ErrorEvent:
    error: LuxError

    def to_json(self) -> dict[str, Any]:
        return {"event": "error", "error": self.error.to_json()}


@dataclass(slots=True)
class DoneEvent:
    def to_json(self) -> dict[str, Any]:
        return {"event": "done"}


StreamEvent = (ConversationStart | ItemStart | BlockStart | BlockDelta | BlockEnd | ItemEnd
               | BlockDiscard | AnnotationsEvent | FinishEvent | UsageEvent | ErrorEvent | DoneEvent)

# --- event JSON reading ---------------------------------------------------------------


def _int(o: dict[str, Any], key: str, path: str) -> int:
    v = o.get(key)
    if type(v) is not int:
        raise LuxDecodeError(f"{path}.{key}", "is required and must be an integer")
    return v


def _str(o: dict[str, Any], key: str, path: str) -> str:
    v = o.get(key)
    if type(v) is not str:
        if isinstance(v, str):
            return str(v)
        raise LuxDecodeError(f"{path}.{key}", "is required and must be a string")
    return v


def delta_from_json(d: Any, path: str = "delta") -> Delta:
    if not isinstance(d, dict):
        raise LuxDecodeError(path, "must be an object")
    t = d.get("type")
    if t == "text":
        return TextDelta(_str(d, "text", path))
    if t == "thinking":
        return ThinkingDelta(_str(d, "text", path))
    if t == "tool_arguments":
        return ToolArgumentsDelta(_str(d, "arguments", path))
    if t == "signature":
        return SignatureDelta(_str(d, "signature", path))
    if t == "refusal":
        return RefusalDelta(_str(d, "text", path))
    if t == "native":
        return NativeDelta(_str(d, "native_tag", path), d.get("native_payload"))
    if t == "provider_data":
        pd = _Decoder().provider_data(d.get("provider_data"), f"{path}.provider_data")
        if pd is None:
            raise LuxDecodeError(f"{path}.provider_data", "needs provider, model and data")
        return ProviderDataDelta(pd, d.get("redacted") is True)
    raise LuxDecodeError(f"{path}.type", "is not a known delta type")


def event_from_json(o: Any) -> StreamEvent:
    """Read one stream event; unknown event names raise ``LuxDecodeError``."""
    if not isinstance(o, dict):
        raise LuxDecodeError("event", "must be an object")
    ev = o.get("event")
    if ev == "block_delta":
        return BlockDelta(_int(o, "index", "block_delta"), delta_from_json(o.get("delta"), "block_delta.delta"))
    if ev == "block_start":
        bt = o.get("block_type")
        if isinstance(bt, dict):
            if bt.get("type") != "tool_call":
                raise LuxDecodeError("block_start.block_type", "object form must be {type: tool_call, id, name}")
            bt = ToolCallStart(_str(bt, "id", "block_start.block_type"), _str(bt, "name", "block_start.block_type"))
        elif not isinstance(bt, str):
            raise LuxDecodeError("block_start.block_type", "is required (a string or a tool_call object)")
        ii = o.get("item_index")
        return BlockStart(_int(o, "index", "block_start"), bt, ii if type(ii) is int else None)
    if ev in ("block_end", "item_end", "block_discard"):
        index = _int(o, "index", ev)
        if ev == "block_end":
            return BlockEnd(index)
        return ItemEnd(index) if ev == "item_end" else BlockDiscard(index)
    if ev == "conversation_start":
        m = o.get("meta") or {}
        if not isinstance(m, dict):
            raise LuxDecodeError("conversation_start.meta", "must be an object")
        d = _Decoder()
        return ConversationStart(ConversationMeta(
            d.opt(m, "id", str, "meta"), d.opt(m, "model", str, "meta"),
            d.opt_int(m, "usage_input", "meta"), d.opt_int(m, "created_at", "meta"),
            d.opt(m, "extra", dict, "meta")))
    if ev == "item_start":
        item = o.get("item")
        if not isinstance(item, dict):
            raise LuxDecodeError("item_start.item", "is required and must be an object")
        return ItemStart(_int(o, "index", "item_start"), item)
    if ev == "annotations":
        anns = o.get("annotations")
        if not isinstance(anns, list):
            raise LuxDecodeError("annotations.annotations", "is required and must be an array")
        d = _Decoder()
        return AnnotationsEvent(_int(o, "index", "annotations"),
                                [d.annotation(a, f"annotations[{i}]") for i, a in enumerate(anns)])
    if ev == "finish":
        fr = _str(o, "finish_reason", "finish")
        return FinishEvent(_FINISH.get(fr, fr))
    if ev == "usage":
        return UsageEvent(_Decoder().usage(o.get("usage"), "usage.usage"))
    if ev == "error":
        return ErrorEvent(_Decoder().error(o.get("error"), "error.error"))
    if ev == "done":
        return DoneEvent()
    raise LuxDecodeError("event", "is missing or not a known stream event name")


def event_to_json(e: StreamEvent) -> dict[str, Any]:
    return e.to_json()


# --- accumulator ----------------------------------------------------------------------

_ACCEPTS_PD = ("text", "thinking", "tool_call")


class _Block:
    __slots__ = ("kind", "parts", "id", "name", "sig", "pd", "redacted", "annotations", "discarded")

    def __init__(self, kind: str, id: str = "", name: str = "") -> None:
        self.kind = kind  # text | thinking | refusal | tool_call | other tags
        self.parts: list[str] = []
        self.id = id
        self.name = name
        self.sig: list[str] = []
        self.pd: ProviderData | None = None
        self.redacted = False
        self.annotations: list[Annotation] | None = None
        self.discarded = False

    def clear(self) -> None:
        self.parts = []
        self.sig = []
        self.pd = None
        self.redacted = False
        self.annotations = None
        self.discarded = True


_DELTA_KIND: dict[type, str] = {TextDelta: "text", ThinkingDelta: "thinking", RefusalDelta: "refusal",
               ToolArgumentsDelta: "tool_call", SignatureDelta: "thinking"}


class StreamAccumulator:
    """Fold Lux IR stream events into one ``LuxResponse`` (single choice).

    ``provider``/``model`` tag opaque state that arrives without a tag (signature
    deltas, redacted thinking) so ``strip_foreign_provider_data`` can keep it for the
    same provider later; ``model`` defaults to ``conversation_start.meta.model``.

        acc = StreamAccumulator(provider="anthropic")
        for ev in events: acc.feed(ev)
        response = acc.result(); acc.diagnostics
    """

    def __init__(self, provider: str | None = None, model: str | None = None,
                 response_id: str | None = None) -> None:
        self.provider = provider
        self.model = model
        self.id = response_id
        self.created_at: int | None = None
        self.finish_reason: str | None = None
        self.error: LuxError | None = None
        self.usage: Usage | None = None
        self.done = False
        self.agent_actions: list[dict[str, Any]] = []
        self.native_events: list[tuple[int, NativeDelta]] = []
        self._blocks: dict[int, _Block] = {}
        self._diags: dict[tuple[str, str], Diagnostic] = {}
        self._dispatch: dict[type, Callable[[Any], None]] = {
            BlockStart: self._on_block_start, BlockEnd: self._noop, ItemEnd: self._noop,
            ConversationStart: self._on_start, ItemStart: self._on_item_start,
            BlockDiscard: self._on_discard, AnnotationsEvent: self._on_annotations,
            FinishEvent: self._on_finish, UsageEvent: self._on_usage,
            ErrorEvent: self._on_error, DoneEvent: self._on_done,
        }

    @property
    def diagnostics(self) -> list[Diagnostic]:
        return list(self._diags.values())

    def _note(self, field_: str, status: ConversionStatus, detail: str) -> None:
        key = (field_, detail)
        if key not in self._diags:
            self._diags[key] = Diagnostic(field_, status, detail)

    # hot path
    def feed(self, ev: StreamEvent) -> None:
        """Fold one event in. Cheap for text deltas (a few dict/list operations)."""
        if type(ev) is BlockDelta:
            d = ev.delta
            td = type(d)
            b = self._blocks.get(ev.index)
            if b is None:
                b = self._implicit_block(ev.index, td)
            if type(d) is TextDelta:
                if b.kind == "text":
                    b.parts.append(d.text)
                    b.discarded = False
                    return
            elif type(d) is ThinkingDelta:
                if b.kind == "thinking":
                    b.parts.append(d.text)
                    b.discarded = False
                    return
            elif type(d) is ToolArgumentsDelta:
                if b.kind == "tool_call":
                    b.parts.append(d.arguments)
                    b.discarded = False
                    return
            elif type(d) is SignatureDelta:
                if b.kind == "thinking":
                    b.sig.append(d.signature)
                    b.discarded = False
                    return
            elif type(d) is RefusalDelta:
                if b.kind == "refusal" or (b.kind == "text" and not b.parts):
                    b.kind = "refusal"  # OpenAI sends refusals beside an empty text block
                    b.parts.append(d.text)
                    b.discarded = False
                    return
            elif type(d) is ProviderDataDelta:
                self._on_provider_data(ev.index, b, d)
                return
            elif type(d) is NativeDelta:
                self.native_events.append((ev.index, d))
                self._note(f"block[{ev.index}].delta.native", ConversionStatus.UNSUPPORTED,
                           "native delta kept in native_events, not in the response")
                return
            self._note(f"block[{ev.index}].delta", ConversionStatus.INVALID,
                       f"{_DELTA_KIND.get(td, 'unknown')} delta on a {b.kind} block ignored")
            return
        self._dispatch[type(ev)](ev)

    def feed_all(self, events: Any) -> StreamAccumulator:
        for ev in events:
            self.feed(ev)
        return self

    def _implicit_block(self, index: int, td: type) -> _Block:
        kind = _DELTA_KIND.get(td, "text")
        b = _Block(kind)
        self._blocks[index] = b
        if kind == "tool_call":
            self._note(f"block[{index}]", ConversionStatus.INVALID,
                       "tool arguments without block_start: call has no id or name")
        return b

    def _noop(self, ev: Any) -> None:
        return None

    def _on_start(self, ev: ConversationStart) -> None:
        m = ev.meta
        if m.id is not None:
            self.id = m.id
        if m.model is not None and self.model is None:
            self.model = m.model
        if m.created_at is not None:
            self.created_at = m.created_at
        if m.usage_input is not None:
            self._merge_usage(Usage(prompt_tokens=m.usage_input, total_tokens=m.usage_input))

    def _on_item_start(self, ev: ItemStart) -> None:
        if ev.item.get("type") == "agent_action":
            self.agent_actions.append(ev.item)
            self._note(f"item[{ev.index}]", ConversionStatus.UNSUPPORTED,
                       "agent_action item kept in agent_actions, not in the response")

    def _on_block_start(self, ev: BlockStart) -> None:
        bt = ev.block_type
        old = self._blocks.get(ev.index)
        if isinstance(bt, ToolCallStart):
            if old is not None and old.kind == "tool_call":
                old.id, old.name = bt.id or old.id, bt.name or old.name
                return
            self._blocks[ev.index] = _Block("tool_call", bt.id, bt.name)
            return
        if old is not None and old.kind == bt:
            return  # a repeated start (e.g. after block_discard) keeps the block
        if old is not None:
            self._note(f"block[{ev.index}]", ConversionStatus.INVALID,
                       "block index reused for another block; the earlier block was replaced")
        self._blocks[ev.index] = _Block(bt)
        if bt not in ("text", "thinking", "refusal"):
            self._note(f"block[{ev.index}]", ConversionStatus.UNSUPPORTED,
                       f"{bt} blocks are not accumulated")

    def _on_provider_data(self, index: int, b: _Block, d: ProviderDataDelta) -> None:
        if b.kind not in _ACCEPTS_PD:
            self._note(f"block[{index}].delta.provider_data", ConversionStatus.UNSUPPORTED,
                       f"provider_data on a {b.kind} block dropped")
            return
        new = d.provider_data
        if b.pd is None:
            b.pd = ProviderData(new.provider, new.model, dict(new.data))
        elif b.pd.owned_by(new.provider, new.model):
            b.pd.data.update(new.data)
        else:
            self._note(f"block[{index}].delta.provider_data", ConversionStatus.INVALID,
                       "provider_data from two producers in one block; the later one kept")
            b.pd = ProviderData(new.provider, new.model, dict(new.data))
        if d.redacted:
            if b.kind == "thinking":
                b.redacted = True
            else:
                self._note(f"block[{index}].delta.provider_data", ConversionStatus.INVALID,
                           "redacted flag on a non-thinking block ignored")
        b.discarded = False

    def _on_discard(self, ev: BlockDiscard) -> None:
        b = self._blocks.get(ev.index)
        if b is not None:
            b.clear()

    def _on_annotations(self, ev: AnnotationsEvent) -> None:
        b = self._blocks.get(ev.index)
        if b is None or b.kind != "text":
            self._note(f"block[{ev.index}].annotations", ConversionStatus.INVALID,
                       "annotations for a block that is not text; dropped")
            return
        if b.annotations is None:
            b.annotations = []
        b.annotations.extend(ev.annotations)

    def _on_finish(self, ev: FinishEvent) -> None:
        if self.finish_reason != FinishReason.ERROR:  # an error stays the outcome
            self.finish_reason = ev.finish_reason

    def _on_usage(self, ev: UsageEvent) -> None:
        self._merge_usage(ev.usage)

    def _merge_usage(self, u: Usage) -> None:
        """Merge field by field, keeping the largest count: provider counters are
        cumulative (Anthropic input at start + output at message_delta; Gemini repeats
        usageMetadata), so max equals the latest value and never loses a part."""
        cur = self.usage
        if cur is None:
            cur = self.usage = Usage()
        cur.prompt_tokens = max(cur.prompt_tokens, u.prompt_tokens)
        cur.completion_tokens = max(cur.completion_tokens, u.completion_tokens)
        cur.total_tokens = max(cur.total_tokens, u.total_tokens,
                               cur.prompt_tokens + cur.completion_tokens)
        for k in ("reasoning_tokens", "cached_tokens", "cache_creation_tokens"):
            v = getattr(u, k)
            if v is not None:
                old = getattr(cur, k)
                setattr(cur, k, v if old is None else max(old, v))

    def _on_error(self, ev: ErrorEvent) -> None:
        self.error = ev.error
        self.finish_reason = FinishReason.ERROR

    def _on_done(self, ev: DoneEvent) -> None:
        self.done = True

    # result
    def content(self) -> list[Content]:
        """The blocks so far, in stream order (partial while streaming)."""
        out: list[Content] = []
        for index, b in self._blocks.items():
            if b.discarded:
                continue
            k = b.kind
            if k == "text":
                text = "".join(b.parts)
                if text or b.annotations or b.pd is not None:
                    out.append(Text(text, b.annotations, b.pd))
            elif k == "thinking":
                text = "".join(b.parts)
                sig = "".join(b.sig) or None
                pd = b.pd
                if pd is None and (sig is not None or b.redacted):
                    if self.provider is not None:
                        pd = ProviderData(self.provider, self.model or "", {})
                    else:
                        self._note(f"block[{index}]", ConversionStatus.DEGRADED,
                                   "signature without a provider tag (pass provider= to the "
                                   "accumulator); it will not be sent back")
                if text or sig is not None or b.redacted or pd is not None:
                    out.append(Thinking(text, b.redacted, sig, None, pd))
            elif k == "tool_call":
                args = "".join(b.parts) or "{}"
                try:
                    json.loads(args)
                except ValueError:
                    self._note(f"block[{index}].tool_use.arguments", ConversionStatus.INVALID,
                               "arguments are not valid JSON; kept as sent")
                out.append(ToolUse(b.id, b.name, args, b.pd))
            elif k == "refusal":
                text = "".join(b.parts)
                if text:
                    out.append(Refusal(text))
        return out

    def result(self) -> LuxResponse:
        """The response so far. Callable at any time (e.g. for progress writes)."""
        content = self.content()
        finish = self.finish_reason
        if finish is None:
            if self.done:
                self._note("finish_reason", ConversionStatus.DEGRADED,
                           "stream ended without a finish event; stop assumed")
            finish = FinishReason.STOP
        return LuxResponse(
            id=self.id or "",
            model=self.model or "",
            choices=[Choice(0, Message(Role.ASSISTANT, content), finish)],
            created_at=self.created_at,
            usage=None if self.usage is None else Usage(**{
                k: getattr(self.usage, k) for k in Usage.__slots__}),
            error=self.error,
        )
