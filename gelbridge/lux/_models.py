"""Lux IR v1 models and their JSON wire form.

Plain ``slots`` dataclasses with hand-written ``to_json``/``from_json``: pydantic
cost ~4x more for the same request (see ``scripts/bench_lux.py``), and the tolerant
reading rules (native enum strings, alternative spellings) are clearer as code.
Treat instances as values: helpers in this package return new objects instead of
mutating their arguments.

``to_json`` returns compact JSON-ready dicts (``None`` fields omitted).
``from_json`` accepts the canonical form and the alternative spellings listed in
``docs/lux-ir.md``; ``decode_request``/``decode_response`` also return the
diagnostics of that reading. Missing required fields raise ``LuxDecodeError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gelbridge.lux._diagnostics import ConversionStatus, Converted, Diagnostic
from gelbridge.lux._errors import LuxDecodeError

SCHEMA_VERSION = "v1"

# --- enums (known values; unknown strings are kept as plain ``str``: "native") ------


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    MODEL = "model"
    DEVELOPER = "developer"


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"
    CONTENT_FILTER = "content_filter"
    SAFETY = "safety"
    RECITATION = "recitation"
    MALFORMED_TOOL_CALL = "malformed_tool_call"
    ERROR = "error"


class ErrorKind(StrEnum):
    RATE_LIMIT = "rate_limit"
    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION = "authentication"
    SERVER_ERROR = "server_error"
    CONTENT_FILTER = "content_filter"


class ReasoningEffort(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    XHIGH = "xhigh"  # not in the schema's enum; emitted anyway (docs/lux-ir.md)


class ToolKind(StrEnum):
    FUNCTION = "function"
    FILE_SEARCH = "file_search"
    WEB_SEARCH = "web_search"
    CODE_INTERPRETER = "code_interpreter"
    COMPUTER_USE = "computer_use"
    CODE_EXECUTION = "code_execution"
    SHELL = "shell"
    APPLY_PATCH = "apply_patch"
    MCP = "mcp"


def _table(enum: type[StrEnum]) -> dict[str, str]:
    return {m.value: m for m in enum}


_ROLES = _table(Role)
_FINISH = _table(FinishReason)
_FINISH["malformed_function_call"] = FinishReason.MALFORMED_TOOL_CALL  # the code's spelling
_ERROR_KINDS = _table(ErrorKind)
_EFFORTS = _table(ReasoningEffort)
_TOOL_KINDS = _table(ToolKind)

_ERROR_KIND_ALIASES: dict[str, ErrorKind] = {
    "rate_limit": ErrorKind.RATE_LIMIT, "rate_limit_exceeded": ErrorKind.RATE_LIMIT,
    "rate_limit_error": ErrorKind.RATE_LIMIT, "429": ErrorKind.RATE_LIMIT,
    "invalid_request": ErrorKind.INVALID_REQUEST,
    "invalid_request_error": ErrorKind.INVALID_REQUEST, "400": ErrorKind.INVALID_REQUEST,
    "authentication": ErrorKind.AUTHENTICATION, "auth_error": ErrorKind.AUTHENTICATION,
    "authentication_error": ErrorKind.AUTHENTICATION, "permission_error": ErrorKind.AUTHENTICATION,
    "401": ErrorKind.AUTHENTICATION, "403": ErrorKind.AUTHENTICATION,
    "server_error": ErrorKind.SERVER_ERROR, "internal_server_error": ErrorKind.SERVER_ERROR,
    "api_error": ErrorKind.SERVER_ERROR, "overloaded_error": ErrorKind.SERVER_ERROR,
    "500": ErrorKind.SERVER_ERROR, "502": ErrorKind.SERVER_ERROR,
    "503": ErrorKind.SERVER_ERROR, "529": ErrorKind.SERVER_ERROR,
    "content_filter": ErrorKind.CONTENT_FILTER, "content_policy": ErrorKind.CONTENT_FILTER,
}


def normalize_error_kind(code: str | int) -> str:
    """Map a provider error type or HTTP status to a Lux error kind (else keep it).

    For adapters and transport; ``LuxError.from_json`` itself does not use it.
    """
    s = str(code)
    return _ERROR_KIND_ALIASES.get(s, s)


def finish_reason_from_str(s: str) -> str:
    """The IR value for ``s``: known spellings become the enum, others stay native."""
    return _FINISH.get(s, s)


# --- provider data (extension) --------------------------------------------------------


@dataclass(slots=True)
class ProviderData:
    """Opaque provider state, tagged with who produced it (PROTOCOL.md §5).

    It may only be sent back to the same ``provider`` and ``model``. It also owns
    the opaque parts of its block: a thinking block's ``signature`` and redacted
    text count as provider data of this tag.
    """

    provider: str
    model: str
    data: dict[str, Any] = field(default_factory=dict)

    def owned_by(self, provider: str, model: str) -> bool:
        return self.provider == provider and self.model == model

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "model": self.model, "data": self.data}


# --- content blocks -------------------------------------------------------------------


@dataclass(slots=True)
class Annotation:
    """A citation on a text block. Wire field ``ref`` (the reference target)."""

    kind: str  # url | file_citation | web_search_citation | native
    text: str | None = None
    ref: str | None = None
    start: int | None = None
    end: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.text is not None:
            out["text"] = self.text
        if self.ref is not None:
            out["ref"] = self.ref
        if self.start is not None:
            out["start"] = self.start
        if self.end is not None:
            out["end"] = self.end
        return out


@dataclass(slots=True)
class Text:
    text: str
    annotations: list[Annotation] | None = None
    provider_data: ProviderData | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "text", "text": self.text}
        if self.annotations is not None:
            out["annotations"] = [a.to_json() for a in self.annotations]
        if self.provider_data is not None:
            out["provider_data"] = self.provider_data.to_json()
        return out


@dataclass(slots=True)
class ToolUse:
    """A tool call. ``arguments`` is a JSON string (the OpenAI form), ``"{}"`` if none."""

    id: str
    name: str
    arguments: str = "{}"
    provider_data: ProviderData | None = None

    def payload_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "tool_use", "tool_use": self.payload_json()}
        if self.provider_data is not None:
            out["provider_data"] = self.provider_data.to_json()
        return out


@dataclass(slots=True)
class ToolResult:
    tool_use_id: str
    content: list[Content]
    is_error: bool = False

    def payload_json(self) -> dict[str, Any]:
        return {
            "tool_use_id": self.tool_use_id,
            "content": contents_json(self.content),
            "is_error": self.is_error,
        }

    def to_json(self) -> dict[str, Any]:
        return {"type": "tool_result", "tool_result": self.payload_json()}


@dataclass(slots=True)
class Thinking:
    """Reasoning. Redacted thinking: ``redacted=True``, ``text=""``, opaque state in
    ``provider_data`` (and/or ``signature`` for compatibility)."""

    text: str = ""
    redacted: bool = False
    signature: str | None = None
    summary: list[Content] | None = None
    provider_data: ProviderData | None = None

    def payload_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text, "redacted": self.redacted}
        if self.signature is not None:
            out["signature"] = self.signature
        if self.summary is not None:
            out["summary"] = contents_json(self.summary)
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "thinking", "thinking": self.payload_json()}
        if self.provider_data is not None:
            out["provider_data"] = self.provider_data.to_json()
        return out

    @property
    def opaque_only(self) -> bool:
        """True when there is no readable text: redacted, or a bare signature."""
        return self.redacted or (
            not self.text and not self.summary
            and (self.signature is not None or self.provider_data is not None)
        )


@dataclass(slots=True)
class Refusal:
    refusal: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "refusal", "refusal": self.refusal}


@dataclass(slots=True)
class MediaSource:
    """``type``: inline (bare base64; MIME in ``media_type``) | url | file_uri."""

    type: str
    data: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "data": self.data}


MEDIA_KINDS = ("image", "audio", "video", "file")


@dataclass(slots=True)
class Media:
    """An image, audio, video or file (PDF, ...) block."""

    kind: str  # one of MEDIA_KINDS
    media_type: str
    source: MediaSource

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            self.kind: {"media_type": self.media_type, "source": self.source.to_json()},
        }


def native_json(tag: str, payload: Any) -> dict[str, Any]:
    """Wire form of a native block or delta (payload left out when absent)."""
    out: dict[str, Any] = {"type": "native", "native_tag": tag}
    if payload is not None:
        out["native_payload"] = payload
    return out


@dataclass(slots=True)
class Native:
    """Escape hatch: a provider block the IR has no type for."""

    tag: str
    payload: Any = None

    def to_json(self) -> dict[str, Any]:
        return native_json(self.tag, self.payload)


Content = Text | ToolUse | ToolResult | Thinking | Refusal | Media | Native

# --- conversation ---------------------------------------------------------------------


@dataclass(slots=True)
class Message:
    role: str  # Role value or a native string
    content: list[Content]
    phase: str | None = None  # Codex phase (commentary / final_answer); extension

    def payload_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": contents_json(self.content)}
        if self.phase is not None:
            out["phase"] = self.phase
        return out

    def to_json(self) -> dict[str, Any]:
        return {"type": "message", "message": self.payload_json()}


@dataclass(slots=True)
class AgentAction:
    """Placeholder for server-side agent items (Responses ``computer_call``...)."""

    kind: str
    id: str
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    result: str | None = None
    provider_payload: Any = None

    def to_json(self) -> dict[str, Any]:
        p: dict[str, Any] = {"kind": self.kind, "id": self.id}
        for k in ("call_id", "name", "arguments", "result", "provider_payload"):
            v = getattr(self, k)
            if v is not None:
                p[k] = v
        return {"type": "agent_action", "agent_action": p}


ConversationItem = Message | AgentAction

# --- tools and options ----------------------------------------------------------------


@dataclass(slots=True)
class Tool:
    name: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    description: str | None = None
    strict: bool | None = None
    kind: str = ToolKind.FUNCTION

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            out["description"] = self.description
        out["parameters"] = self.parameters
        if self.strict is not None:
            out["strict"] = self.strict
        if self.kind != ToolKind.FUNCTION:
            out["kind"] = self.kind
        return out


@dataclass(slots=True)
class ToolChoice:
    """``mode``: auto | none | required | specific_tool (then ``name``)."""

    mode: str = "auto"
    name: str | None = None

    @classmethod
    def auto(cls) -> ToolChoice:
        return cls("auto")

    @classmethod
    def none(cls) -> ToolChoice:
        return cls("none")

    @classmethod
    def required(cls) -> ToolChoice:
        return cls("required")

    @classmethod
    def specific(cls, name: str) -> ToolChoice:
        return cls("specific_tool", name)

    def to_json(self) -> Any:
        if self.mode == "specific_tool":
            return {"type": "specific_tool", "name": self.name or ""}
        return self.mode


@dataclass(slots=True)
class StructuredOutput:
    """``type``: text | json_object | json_schema (then ``schema``; ``name`` and
    ``strict`` are gelbridge extensions on the json_schema object)."""

    type: str = "json_object"
    schema: dict[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None

    def to_json(self) -> Any:
        if self.type != "json_schema":
            return self.type
        out: dict[str, Any] = {"type": "json_schema", "schema": self.schema or {}}
        if self.name is not None:
            out["name"] = self.name
        if self.strict is not None:
            out["strict"] = self.strict
        return out


@dataclass(slots=True)
class Options:
    stream: bool
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_output_tokens: int | None = None
    stop: list[str] | None = None
    candidate_count: int | None = None
    seed: int | None = None
    structured_output: StructuredOutput | None = None
    store: bool | None = None
    extras: dict[str, Any] | None = None  # provider pass-through (incl. previous_response_id)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stream": self.stream}
        for k in ("temperature", "top_p", "top_k", "max_output_tokens", "stop",
                  "candidate_count", "seed"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        if self.structured_output is not None:
            out["structured_output"] = self.structured_output.to_json()
        if self.store is not None:
            out["store"] = self.store
        if self.extras is not None:
            out["extras"] = self.extras
        return out


@dataclass(slots=True)
class ReasoningConfig:
    enabled: bool
    budget_tokens: int | None = None
    effort: str | None = None  # ReasoningEffort or native string
    summary: str | None = None  # auto | concise | detailed

    @classmethod
    def from_effort(cls, effort: str | None) -> ReasoningConfig | None:
        """From a gelbridge record effort (none|low|medium|high|max): none → disabled,
        max → xhigh, None → None (provider default)."""
        if effort is None:
            return None
        if effort == "none":
            return cls(enabled=False)
        if effort == "max":
            return cls(enabled=True, effort=ReasoningEffort.XHIGH)
        return cls(enabled=True, effort=_EFFORTS.get(effort, effort))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled}
        if self.budget_tokens is not None:
            out["budget_tokens"] = self.budget_tokens
        if self.effort is not None:
            out["effort"] = self.effort
        if self.summary is not None:
            out["summary"] = self.summary
        return out


_CAP_LEVELS = ("tool_calling", "parallel_tool_calls", "reasoning", "multimodal_input",
               "structured_output")


@dataclass(slots=True)
class Capabilities:
    """Declared capabilities (introspection only). Levels: full | partial | none."""

    tool_calling: str = "none"
    parallel_tool_calls: str = "none"
    reasoning: str = "none"
    multimodal_input: str = "none"
    structured_output: str = "none"
    input_modalities: list[str] = field(default_factory=lambda: ["text"])
    output_modalities: list[str] = field(default_factory=lambda: ["text"])

    def to_json(self) -> dict[str, Any]:
        return {
            "tool_calling": self.tool_calling,
            "parallel_tool_calls": self.parallel_tool_calls,
            "reasoning": self.reasoning,
            "multimodal_input": self.multimodal_input,
            "structured_output": self.structured_output,
            "input_modalities": list(self.input_modalities),
            "output_modalities": list(self.output_modalities),
        }


@dataclass(slots=True)
class LuxRequest:
    model: str
    conversation: list[ConversationItem]
    options: Options
    instructions: list[Content] | None = None  # the system prompt lives here only
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    capabilities: Capabilities | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    extra: dict[str, Any] | None = None
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        out = request_json(self)
        assert out is not None  # None only when ``owner`` is given
        return out

    def _json(self, model: str, map_id: Callable[[str], str] | None,
              owner: tuple[str, str] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": self.schema_version, "model": model}
        if self.instructions is not None:
            out["instructions"] = contents_json(self.instructions, None, owner)
        out["conversation"] = conversation_json(self.conversation, map_id, owner)
        if self.tools is not None:
            out["tools"] = [t.to_json() for t in self.tools]
        if self.tool_choice is not None:
            out["tool_choice"] = self.tool_choice.to_json()
        out["options"] = self.options.to_json()
        if self.capabilities is not None:
            out["capabilities"] = self.capabilities.to_json()
        if self.reasoning is not None:
            out["reasoning"] = self.reasoning.to_json()
        if self.metadata is not None:
            out["metadata"] = self.metadata
        if self.extra is not None:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_json(cls, obj: Any) -> LuxRequest:
        return decode_request(obj).value


def _first_result_id(item: ConversationItem) -> str:
    """The call id of a single-result tool message (the run being reordered)."""
    block = item.content[0] if isinstance(item, Message) and item.content else None
    return block.tool_use_id if isinstance(block, ToolResult) else ""


def request_json(req: LuxRequest, *, model: str | None = None,
                 map_id: Callable[[str], str] | None = None,
                 owner: tuple[str, str] | None = None) -> dict[str, Any] | None:
    """``req.to_json()``, optionally with another ``model`` and with every tool-call id
    of the conversation's messages (``tool_use.id``, ``tool_result.tool_use_id``, in
    conversation order) passed through ``map_id``: what an adapter receives, without
    copying the request first.

    ``owner`` = (provider, model): return None as soon as a block carries provider
    state not owned by exactly them (provider_data with another tag; a signature or
    redacted thinking without a tag), anywhere ``strip_foreign_provider_data`` looks or
    deeper. A result therefore means that stripping would change nothing, and the scan
    costs no walk of its own."""
    try:
        return req._json(req.model if model is None else model, map_id, owner)
    except _ForeignState:
        return None


class _ForeignState(Exception):
    """Raised inside ``request_json(owner=...)``: a block holds state of another owner."""


_FOREIGN = _ForeignState()


def _pd_json(pd: ProviderData, owner: tuple[str, str] | None) -> dict[str, Any]:
    if owner is not None and (pd.provider != owner[0] or pd.model != owner[1]):
        raise _FOREIGN
    return {"provider": pd.provider, "model": pd.model, "data": pd.data}


def contents_json(blocks: list[Content], map_id: Callable[[str], str] | None = None,
                  owner: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """``[c.to_json() for c in blocks]``, with the common blocks written inline (this is
    the bulk of a request: a per-block method call and helper dicts cost more than
    the dicts themselves). ``map_id``, ``owner``: as in ``request_json``, for these
    blocks (``map_id`` not for nested ones)."""
    out: list[dict[str, Any]] = []
    append = out.append
    for c in blocks:
        if type(c) is Text:
            pd = c.provider_data
            if c.annotations is None and pd is None:
                append({"type": "text", "text": c.text})
            else:
                d = c.to_json()
                if pd is not None:
                    d["provider_data"] = _pd_json(pd, owner)
                append(d)
        elif type(c) is Thinking:
            p: dict[str, Any] = {"text": c.text, "redacted": c.redacted}
            if c.signature is not None:
                p["signature"] = c.signature
            if c.summary is not None:
                p["summary"] = contents_json(c.summary, None, owner)
            d = {"type": "thinking", "thinking": p}
            pd = c.provider_data
            if pd is not None:
                d["provider_data"] = _pd_json(pd, owner)
            elif owner is not None and (c.signature is not None or c.redacted):
                raise _FOREIGN  # opaque state without a tag: no known producer
            append(d)
        elif type(c) is ToolUse:
            cid = c.id if map_id is None else map_id(c.id)
            d = {"type": "tool_use",
                 "tool_use": {"id": cid, "name": c.name, "arguments": c.arguments}}
            pd = c.provider_data
            if pd is not None:
                d["provider_data"] = _pd_json(pd, owner)
            append(d)
        elif type(c) is ToolResult:
            rid = c.tool_use_id if map_id is None else map_id(c.tool_use_id)
            append({"type": "tool_result", "tool_result": {
                "tool_use_id": rid, "content": contents_json(c.content, None, owner),
                "is_error": c.is_error}})
        else:
            append(c.to_json())
    return out


def conversation_json(items: list[ConversationItem], map_id: Callable[[str], str] | None = None,
                      owner: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """``[i.to_json() for i in items]`` (see ``contents_json``; ``map_id`` applies to the
    top-level blocks of each message)."""
    out: list[dict[str, Any]] = []
    append = out.append
    for item in items:
        if type(item) is Message:
            content = item.content
            c = content[0] if len(content) == 1 else None
            if type(c) is Text and c.annotations is None and c.provider_data is None:
                blocks = [{"type": "text", "text": c.text}]  # the usual user turn: no call
            else:
                blocks = contents_json(content, map_id, owner)
            m: dict[str, Any] = {"role": item.role, "content": blocks}
            if item.phase is not None:
                m["phase"] = item.phase
            append({"type": "message", "message": m})
        else:
            append(item.to_json())
    return out


# --- response -------------------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None
    cache_creation_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.reasoning_tokens is not None:
            out["reasoning_tokens"] = self.reasoning_tokens
        if self.cached_tokens is not None:
            out["cached_tokens"] = self.cached_tokens
        if self.cache_creation_tokens is not None:
            out["cache_creation_tokens"] = self.cache_creation_tokens
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Usage:
        return _Decoder().usage(obj, "usage")


@dataclass(slots=True)
class LuxError:
    """The IR's error object (data, not an exception)."""

    kind: str  # ErrorKind or native string
    message: str
    provider_code: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message}
        if self.provider_code is not None:
            out["provider_code"] = self.provider_code
        return out

    @classmethod
    def from_json(cls, obj: Any) -> LuxError:
        return _Decoder().error(obj, "error")


@dataclass(slots=True)
class SafetyRating:
    category: str
    probability: str

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "probability": self.probability}


@dataclass(slots=True)
class Choice:
    index: int
    message: Message
    finish_reason: str  # FinishReason or native string
    safety_ratings: list[SafetyRating] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "message": self.message.payload_json(),
            "finish_reason": self.finish_reason,
        }
        if self.safety_ratings is not None:
            out["safety_ratings"] = [s.to_json() for s in self.safety_ratings]
        return out


@dataclass(slots=True)
class LuxResponse:
    id: str
    model: str
    choices: list[Choice]
    created_at: int | None = None
    usage: Usage | None = None
    provider_payload: Any = None
    error: LuxError | None = None  # extension: the error that ended a stream
    schema_version: str = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": self.schema_version, "id": self.id,
                               "model": self.model}
        if self.created_at is not None:
            out["created_at"] = self.created_at
        out["choices"] = [c.to_json() for c in self.choices]
        if self.usage is not None:
            out["usage"] = self.usage.to_json()
        if self.provider_payload is not None:
            out["provider_payload"] = self.provider_payload
        if self.error is not None:
            out["error"] = self.error.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> LuxResponse:
        return decode_response(obj).value

    @property
    def message(self) -> Message:
        return self.choices[0].message


# --- decoding -------------------------------------------------------------------------


def decode_request(obj: Any) -> Converted[LuxRequest]:
    """Read a request (canonical or alternative spellings) plus reading diagnostics."""
    d = _Decoder()
    return Converted(d.request(obj), d.diags)


def decode_response(obj: Any) -> Converted[LuxResponse]:
    """Read a response plus reading diagnostics."""
    fast = read_plain_response(obj)
    if fast is not None:
        return Converted(fast, [])
    d = _Decoder()
    return Converted(d.response(obj), d.diags)


class _NotPlain(Exception):
    """Raised inside ``read_plain_response``: leave this input to the full reader."""


_NOT_PLAIN = _NotPlain()
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens", "cached_tokens",
               "cache_creation_tokens")


def read_plain_response(obj: Any, tag: tuple[str, str] | None = None) -> LuxResponse | None:
    """The common response in one pass, or None to use the full reader (``decode_response``).

    Reads only canonical, well-typed responses whose content is text (no annotations),
    thinking (no summary), tool_use and refusal blocks, without error, safety ratings
    or ``message.reasoning``; for such input it returns exactly what ``decode_response``
    returns, which has no diagnostics then. Anything else (a wrong type, a missing
    field, another block type) gives None, and the full reader decides, reports or
    raises. ``tag`` = (provider, model) also does what ``lux_response_from_adapter``
    does around the full reader: empty ``provider``/``model`` of provider_data are
    filled in, and an untagged signature or redacted thinking gets the tag.
    """
    try:
        return _plain_response(obj, tag)
    except _NotPlain:
        return None


def _plain_pd(v: Any, tag: tuple[str, str] | None) -> ProviderData | None:
    if v is None:
        return None
    if type(v) is not dict:
        raise _NOT_PLAIN
    p, m, data = v.get("provider"), v.get("model"), v.get("data")
    if tag is not None:
        if not p:
            p = tag[0]
        if not m:
            m = tag[1]
        if data is None:
            data = {}
    elif data is None and "data" not in v:
        data = {}
    if type(p) is not str or type(m) is not str or type(data) is not dict:
        raise _NOT_PLAIN
    return ProviderData(p, m, dict(data))


def _plain_content(blocks: Any, tag: tuple[str, str] | None) -> list[Content]:
    if type(blocks) is not list:
        raise _NOT_PLAIN
    out: list[Content] = []
    append = out.append
    for o in blocks:
        if type(o) is not dict:
            raise _NOT_PLAIN
        t = o.get("type")
        if t == "text":
            text = o.get("text")
            if type(text) is not str or o.get("annotations") is not None:
                raise _NOT_PLAIN
            append(Text(text, None, _plain_pd(o.get("provider_data"), tag)))
        elif t == "thinking":
            p = o.get("thinking")
            if type(p) is not dict or p.get("summary") is not None:
                raise _NOT_PLAIN
            text, redacted, sig = p.get("text", ""), p.get("redacted", False), p.get("signature")
            if type(text) is not str or type(redacted) is not bool or (sig is not None and type(sig) is not str):
                raise _NOT_PLAIN
            pd = _plain_pd(o["provider_data"] if "provider_data" in o else p.get("provider_data"), tag)
            if pd is None and tag is not None and (sig is not None or redacted):
                pd = ProviderData(tag[0], tag[1], {})
            append(Thinking(text, redacted, sig, None, pd))
        elif t == "tool_use":
            p = o.get("tool_use")
            if type(p) is not dict:
                raise _NOT_PLAIN
            cid, name, args = p.get("id"), p.get("name"), p.get("arguments")
            if type(cid) is not str or type(name) is not str:
                raise _NOT_PLAIN
            if args is None:
                args = "{}"
            elif type(args) is not str:
                args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            pd = _plain_pd(o["provider_data"] if "provider_data" in o else p.get("provider_data"), tag)
            append(ToolUse(cid, name, args, pd))
        elif t == "refusal":
            r = o.get("refusal")
            if type(r) is not str:
                raise _NOT_PLAIN
            append(Refusal(r))
        else:
            raise _NOT_PLAIN
    return out


def _plain_response(o: Any, tag: tuple[str, str] | None) -> LuxResponse:
    if type(o) is not dict or o.get("schema_version") != SCHEMA_VERSION or o.get("error") is not None:
        raise _NOT_PLAIN
    rid, model, choices = o.get("id"), o.get("model"), o.get("choices")
    if type(rid) is not str or type(model) is not str or type(choices) is not list or not choices:
        raise _NOT_PLAIN
    out_choices = []
    for c in choices:
        if type(c) is not dict or c.get("safety_ratings") is not None:
            raise _NOT_PLAIN
        fr, msg = c.get("finish_reason"), c.get("message")
        if type(fr) is not str or type(msg) is not dict or "reasoning" in msg:
            raise _NOT_PLAIN
        role, phase = msg.get("role"), msg.get("phase")
        if type(role) is not str or (phase is not None and type(phase) is not str):
            raise _NOT_PLAIN
        index = c.get("index", 0)
        out_choices.append(Choice(index if isinstance(index, int) else 0,
                                  Message(_ROLES.get(role, role), _plain_content(msg.get("content", []), tag), phase),
                                  _FINISH.get(fr, fr)))
    created = o.get("created_at")
    if created is not None and type(created) is not int:
        raise _NOT_PLAIN
    usage = None
    u = o.get("usage")
    if u is not None:
        if type(u) is not dict:
            raise _NOT_PLAIN
        for k in _USAGE_KEYS:
            v = u.get(k)
            if v is not None and type(v) is not int:
                raise _NOT_PLAIN
        p, cpl, tot = u.get("prompt_tokens") or 0, u.get("completion_tokens") or 0, u.get("total_tokens")
        usage = Usage(p, cpl, p + cpl if tot is None else tot, u.get("reasoning_tokens"), u.get("cached_tokens"),
                      u.get("cache_creation_tokens"))
    return LuxResponse(rid, model, out_choices, created, usage, o.get("provider_payload"))


def content_from_json(obj: Any, path: str = "content") -> Content:
    return _Decoder().content(obj, path)


def _tname(v: Any) -> str:
    return type(v).__name__


class _Decoder:
    """Tolerant reader. Wrong-typed optional fields are dropped with an ``invalid``
    diagnostic; missing or wrong-typed required fields raise ``LuxDecodeError``."""

    __slots__ = ("diags",)

    def __init__(self) -> None:
        self.diags: list[Diagnostic] = []

    # helpers
    def note(self, path: str, status: ConversionStatus, detail: str | None = None) -> None:
        self.diags.append(Diagnostic(path, status, detail))

    def obj(self, v: Any, path: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise LuxDecodeError(path, f"must be an object, got {_tname(v)}")
        return v

    def req_str(self, o: dict[str, Any], key: str, path: str) -> str:
        v = o.get(key)
        if not isinstance(v, str):
            raise LuxDecodeError(f"{path}.{key}", "is required and must be a string"
                                 if v is None else f"must be a string, got {_tname(v)}")
        return v

    def req_list(self, o: dict[str, Any], key: str, path: str) -> list[Any]:
        v = o.get(key)
        if not isinstance(v, list):
            raise LuxDecodeError(f"{path}.{key}", "is required and must be an array"
                                 if v is None else f"must be an array, got {_tname(v)}")
        return v

    def opt(self, o: dict[str, Any], key: str, types: Any, path: str) -> Any:
        v = o.get(key)
        if v is None:
            return None
        if isinstance(v, bool) and types in (int, float, (int, float)):
            self.note(f"{path}.{key}", ConversionStatus.INVALID, "expected number, got bool")
            return None
        if not isinstance(v, types):
            self.note(f"{path}.{key}", ConversionStatus.INVALID, f"wrong type {_tname(v)}; dropped")
            return None
        return v

    def opt_int(self, o: dict[str, Any], key: str, path: str) -> int | None:
        v = o.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                return int(v)
            self.note(f"{path}.{key}", ConversionStatus.INVALID, f"wrong type {_tname(v)}; dropped")
            return None
        return v

    def opt_num(self, o: dict[str, Any], key: str, path: str) -> float | None:
        v = o.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self.note(f"{path}.{key}", ConversionStatus.INVALID, f"wrong type {_tname(v)}; dropped")
            return None
        return v

    # content
    def provider_data(self, v: Any, path: str) -> ProviderData | None:
        if v is None:
            return None
        if (isinstance(v, dict) and isinstance(v.get("provider"), str)
                and isinstance(v.get("model"), str) and isinstance(v.get("data", {}), dict)):
            return ProviderData(v["provider"], v["model"], dict(v.get("data") or {}))
        self.note(path, ConversionStatus.INVALID, "needs provider, model (strings) and data (object); dropped")
        return None

    def content_list(self, v: Any, path: str) -> list[Content]:
        if isinstance(v, str):  # OpenAI-style plain string content
            return [Text(v)]
        if not isinstance(v, list):
            raise LuxDecodeError(path, f"must be an array, got {_tname(v)}")
        return [self.content(c, f"{path}[{i}]") for i, c in enumerate(v)]

    def annotation(self, v: Any, path: str) -> Annotation:
        o = self.obj(v, path)
        return Annotation(
            kind=self.req_str(o, "kind", path),
            text=self.opt(o, "text", str, path),
            ref=self.opt(o, "ref", str, path),
            start=self.opt_int(o, "start", path),
            end=self.opt_int(o, "end", path),
        )

    def tool_use(self, o: dict[str, Any], path: str, outer: dict[str, Any] | None = None) -> ToolUse:
        args = o.get("arguments")
        if args is None:
            args = "{}"
        elif not isinstance(args, str):  # Anthropic/Gemini object arguments
            args = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
        pd = (outer or {}).get("provider_data", o.get("provider_data"))
        return ToolUse(
            id=self.req_str(o, "id", path),
            name=self.req_str(o, "name", path),
            arguments=args,
            provider_data=self.provider_data(pd, f"{path}.provider_data"),
        )

    def tool_result(self, o: dict[str, Any], path: str) -> ToolResult:
        content = o.get("content")
        is_error = o.get("is_error", False)
        if not isinstance(is_error, bool):
            self.note(f"{path}.is_error", ConversionStatus.INVALID, "not a boolean; read as false")
            is_error = False
        return ToolResult(
            tool_use_id=self.req_str(o, "tool_use_id", path),
            content=[] if content is None else self.content_list(content, f"{path}.content"),
            is_error=is_error,
        )

    def thinking(self, o: dict[str, Any], path: str, outer: dict[str, Any] | None = None) -> Thinking:
        text = o.get("text", "")
        if not isinstance(text, str):
            raise LuxDecodeError(f"{path}.text", f"must be a string, got {_tname(text)}")
        redacted = o.get("redacted", False)
        if not isinstance(redacted, bool):
            raise LuxDecodeError(f"{path}.redacted", f"must be a boolean, got {_tname(redacted)}")
        summary = o.get("summary")
        pd = (outer or {}).get("provider_data", o.get("provider_data"))
        return Thinking(
            text=text,
            redacted=redacted,
            signature=self.opt(o, "signature", str, path),
            summary=None if summary is None else self.content_list(summary, f"{path}.summary"),
            provider_data=self.provider_data(pd, f"{path}.provider_data"),
        )

    def media(self, kind: str, o: dict[str, Any], path: str) -> Media:
        p = self.obj(o.get(kind), f"{path}.{kind}")
        src = p.get("source")
        if not isinstance(src, dict):
            raise LuxDecodeError(f"{path}.{kind}.source",
                                 "must be an object {type, data} (the schema's bare string has no data)")
        return Media(
            kind=kind,
            media_type=self.req_str(p, "media_type", f"{path}.{kind}"),
            source=MediaSource(self.req_str(src, "type", f"{path}.{kind}.source"),
                               self.req_str(src, "data", f"{path}.{kind}.source")),
        )

    def content(self, v: Any, path: str) -> Content:
        o = self.obj(v, path)
        t = self.req_str(o, "type", path)
        if t == "text":
            anns = o.get("annotations")
            annotations = None
            if anns is not None:
                if isinstance(anns, list):
                    annotations = [self.annotation(a, f"{path}.annotations[{i}]")
                                   for i, a in enumerate(anns)]
                else:
                    self.note(f"{path}.annotations", ConversionStatus.INVALID, "not an array; dropped")
            return Text(self.req_str(o, "text", path), annotations,
                        self.provider_data(o.get("provider_data"), f"{path}.provider_data"))
        if t == "tool_use":
            return self.tool_use(self.obj(o.get("tool_use"), f"{path}.tool_use"), f"{path}.tool_use", o)
        if t == "tool_result":
            return self.tool_result(self.obj(o.get("tool_result"), f"{path}.tool_result"),
                                    f"{path}.tool_result")
        if t == "thinking":
            return self.thinking(self.obj(o.get("thinking"), f"{path}.thinking"), f"{path}.thinking", o)
        if t == "refusal":
            return Refusal(self.req_str(o, "refusal", path))
        if t in MEDIA_KINDS:
            return self.media(t, o, path)
        if t == "native":
            return Native(self.req_str(o, "native_tag", path), o.get("native_payload"))
        # unknown content type: keep the whole object as a native block
        return Native(t, o)

    # messages and conversation
    def message(self, v: Any, path: str) -> Message:
        o = self.obj(v, path)
        role = self.req_str(o, "role", path)
        content = self.content_list(o.get("content", []), f"{path}.content")
        reasoning = o.get("reasoning")
        if reasoning is not None:
            rpath = f"{path}.reasoning"
            th = self.thinking(self.obj(reasoning, rpath), rpath)
            if any(type(c) is Thinking for c in content):
                self.note(rpath, ConversionStatus.DEGRADED,
                          "message has thinking blocks too; the blocks win, message.reasoning dropped")
            else:
                content.insert(0, th)
        return Message(_ROLES.get(role, role), content, self.opt(o, "phase", str, path))

    def agent_action(self, v: Any, path: str) -> AgentAction:
        o = self.obj(v, path)
        return AgentAction(
            kind=self.req_str(o, "kind", path),
            id=self.req_str(o, "id", path),
            call_id=self.opt(o, "call_id", str, path),
            name=self.opt(o, "name", str, path),
            arguments=self.opt(o, "arguments", str, path),
            result=self.opt(o, "result", str, path),
            provider_payload=o.get("provider_payload"),
        )

    def conversation(self, items: list[Any], path: str) -> list[ConversationItem]:
        out: list[ConversationItem] = []
        synthetic: Message | None = None  # assistant message built from loose items
        for i, raw in enumerate(items):
            ipath = f"{path}[{i}]"
            o = self.obj(raw, ipath)
            t = self.req_str(o, "type", ipath)
            if t == "message":
                m = self.message(o.get("message"), f"{ipath}.message")
                if synthetic is not None and out and out[-1] is synthetic and m.role == Role.ASSISTANT:
                    synthetic.content.extend(m.content)  # reasoning item + its message
                    synthetic.phase = m.phase
                else:
                    out.append(m)
                synthetic = None
                continue
            if t in ("tool_call", "reasoning"):
                p = self.obj(o.get(t), f"{ipath}.{t}")
                block: Content = (self.tool_use(p, f"{ipath}.{t}", o) if t == "tool_call"
                                  else self.thinking(p, f"{ipath}.{t}", o))
                last = out[-1] if out else None
                if type(last) is Message and last.role == Role.ASSISTANT:
                    last.content.append(block)
                else:
                    synthetic = Message(Role.ASSISTANT, [block])
                    out.append(synthetic)
                    continue
                continue
            if t == "tool_result":
                tr = self.tool_result(self.obj(o.get(t), f"{ipath}.{t}"), f"{ipath}.{t}")
                out.append(Message(Role.TOOL, [tr]))
            elif t == "agent_action":
                out.append(self.agent_action(o.get(t), f"{ipath}.{t}"))
            else:
                raise LuxDecodeError(f"{ipath}.type", "is not a known conversation item type "
                                     "(message, tool_call, tool_result, reasoning, agent_action)")
            synthetic = None
        return _canonical_tool_results(out)

    # options and friends
    def tools(self, v: Any, path: str) -> list[Tool] | None:
        if not isinstance(v, list):
            self.note(path, ConversionStatus.INVALID, "not an array; dropped")
            return None
        out = []
        for i, t in enumerate(v):
            tp = f"{path}[{i}]"
            o = self.obj(t, tp)
            kind = o.get("kind", "function")
            kind = _TOOL_KINDS.get(kind, kind) if isinstance(kind, str) else ToolKind.FUNCTION
            params = o.get("parameters")
            if isinstance(params, str):
                try:
                    params = json.loads(params)
                except ValueError:
                    raise LuxDecodeError(f"{tp}.parameters", "is a string that is not JSON") from None
            if params is None:
                if kind == ToolKind.FUNCTION:
                    raise LuxDecodeError(f"{tp}.parameters", "is required for function tools")
                params = {}
            if not isinstance(params, dict):
                raise LuxDecodeError(f"{tp}.parameters", f"must be an object, got {_tname(params)}")
            out.append(Tool(self.req_str(o, "name", tp), params,
                            self.opt(o, "description", str, tp), self.opt(o, "strict", bool, tp), kind))
        return out

    def tool_choice(self, v: Any, path: str) -> ToolChoice | None:
        if isinstance(v, str):
            return ToolChoice(v)
        if isinstance(v, dict) and v.get("type") == "specific_tool" and isinstance(v.get("name"), str):
            return ToolChoice.specific(v["name"])
        self.note(path, ConversionStatus.INVALID, "not auto/none/required or {type: specific_tool, name}; dropped")
        return None

    def structured_output(self, v: Any, path: str) -> StructuredOutput | None:
        if isinstance(v, str):
            return StructuredOutput(v)
        if isinstance(v, dict) and v.get("type") == "json_schema" and isinstance(v.get("schema"), dict):
            return StructuredOutput("json_schema", v["schema"], self.opt(v, "name", str, path),
                                    self.opt(v, "strict", bool, path))
        self.note(path, ConversionStatus.INVALID, "unrecognised structured output; dropped")
        return None

    def options(self, v: Any, path: str) -> Options:
        o = self.obj(v, path)
        stream = o.get("stream")
        if not isinstance(stream, bool):
            raise LuxDecodeError(f"{path}.stream", "is required and must be a boolean")
        extras = self.opt(o, "extras", dict, path)
        if "previous_response_id" in o:  # transport state: kept in extras
            extras = dict(extras or {})
            extras.setdefault("previous_response_id", o["previous_response_id"])
        stop = o.get("stop")
        if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
            self.note(f"{path}.stop", ConversionStatus.INVALID, "not an array of strings; dropped")
            stop = None
        so = o.get("structured_output")
        return Options(
            stream=stream,
            temperature=self.opt_num(o, "temperature", path),
            top_p=self.opt_num(o, "top_p", path),
            top_k=self.opt_int(o, "top_k", path),
            max_output_tokens=self.opt_int(o, "max_output_tokens", path),
            stop=stop,
            candidate_count=self.opt_int(o, "candidate_count", path),
            seed=self.opt_int(o, "seed", path),
            structured_output=None if so is None else self.structured_output(so, f"{path}.structured_output"),
            store=self.opt(o, "store", bool, path),
            extras=extras,
        )

    def reasoning(self, v: Any, path: str) -> ReasoningConfig | None:
        if not isinstance(v, dict) or not isinstance(v.get("enabled"), bool):
            self.note(path, ConversionStatus.INVALID, "needs an object with boolean enabled; dropped")
            return None
        enabled = v["enabled"]
        effort = self.opt(v, "effort", str, path)
        if effort == "none":
            enabled, effort = False, None
        elif effort == "max":
            effort = ReasoningEffort.XHIGH
        elif effort is not None:
            effort = _EFFORTS.get(effort, effort)
        return ReasoningConfig(enabled, self.opt_int(v, "budget_tokens", path), effort,
                               self.opt(v, "summary", str, path))

    def capabilities(self, v: Any, path: str) -> Capabilities | None:
        if not isinstance(v, dict):
            self.note(path, ConversionStatus.INVALID, "not an object; dropped")
            return None
        c = Capabilities()
        for k in _CAP_LEVELS:
            lv = v.get(k)
            if isinstance(lv, str):
                setattr(c, k, lv)
        for k in ("input_modalities", "output_modalities"):
            lv = v.get(k)
            if isinstance(lv, list):
                setattr(c, k, [m for m in lv if isinstance(m, str)])
        return c

    def request(self, v: Any) -> LuxRequest:
        o = self.obj(v, "request")
        sv = self.req_str(o, "schema_version", "request")
        if sv != SCHEMA_VERSION:
            raise LuxDecodeError("request.schema_version", "is not v1 (gelbridge reads Lux IR v1 only)")
        instructions = None
        if o.get("instructions") is not None:
            instructions = self.content_list(o["instructions"], "instructions")
        conversation = self.conversation(self.req_list(o, "conversation", "request"), "conversation")
        # system prompt lives in instructions: hoist leading text-only system messages
        while conversation and isinstance(first := conversation[0], Message) and first.role == Role.SYSTEM \
                and all(type(c) is Text for c in first.content):
            conversation.pop(0)
            instructions = (instructions or []) + first.content
        metadata = self.opt(o, "metadata", dict, "request")
        if metadata is not None and not all(isinstance(x, str) for x in metadata.values()):
            self.note("metadata", ConversionStatus.INVALID, "non-string values dropped")
            metadata = {k: x for k, x in metadata.items() if isinstance(x, str)}
        if "options" not in o:
            raise LuxDecodeError("request.options", "is required (an object with stream)")
        return LuxRequest(
            model=self.req_str(o, "model", "request"),
            conversation=conversation,
            options=self.options(o["options"], "options"),
            instructions=instructions,
            tools=None if o.get("tools") is None else self.tools(o["tools"], "tools"),
            tool_choice=None if o.get("tool_choice") is None else self.tool_choice(o["tool_choice"], "tool_choice"),
            capabilities=None if o.get("capabilities") is None else self.capabilities(o["capabilities"], "capabilities"),
            reasoning=None if o.get("reasoning") is None else self.reasoning(o["reasoning"], "reasoning"),
            metadata=metadata,
            extra=self.opt(o, "extra", dict, "request"),
        )

    # response side
    def usage(self, v: Any, path: str) -> Usage:
        o = self.obj(v, path)
        u = Usage(
            prompt_tokens=self.opt_int(o, "prompt_tokens", path) or 0,
            completion_tokens=self.opt_int(o, "completion_tokens", path) or 0,
            total_tokens=self.opt_int(o, "total_tokens", path) or 0,
            reasoning_tokens=self.opt_int(o, "reasoning_tokens", path),
            cached_tokens=self.opt_int(o, "cached_tokens", path),
            cache_creation_tokens=self.opt_int(o, "cache_creation_tokens", path),
        )
        if o.get("total_tokens") is None:
            u.total_tokens = u.prompt_tokens + u.completion_tokens
        return u

    def error(self, v: Any, path: str) -> LuxError:
        o = self.obj(v, path)
        kind = self.req_str(o, "kind", path)
        msg = o.get("message", "")
        return LuxError(_ERROR_KINDS.get(kind, kind), msg if isinstance(msg, str) else "",
                        self.opt(o, "provider_code", str, path))

    def choice(self, v: Any, path: str) -> Choice:
        o = self.obj(v, path)
        fr = self.req_str(o, "finish_reason", path)
        sr = o.get("safety_ratings")
        ratings = None
        if isinstance(sr, list):
            ratings = [SafetyRating(str(r.get("category", "")), str(r.get("probability", "")))
                       for r in sr if isinstance(r, dict)]
        index = o.get("index", 0)
        return Choice(index if isinstance(index, int) else 0, self.message(o.get("message"), f"{path}.message"),
                      _FINISH.get(fr, fr), ratings)

    def response(self, v: Any) -> LuxResponse:
        o = self.obj(v, "response")
        sv = self.req_str(o, "schema_version", "response")
        if sv != SCHEMA_VERSION:
            raise LuxDecodeError("response.schema_version", "is not v1 (gelbridge reads Lux IR v1 only)")
        choices = self.req_list(o, "choices", "response")
        if not choices:
            raise LuxDecodeError("response.choices", "must hold at least one choice")
        usage = None
        if o.get("usage") is not None:
            usage = self.usage(o["usage"], "usage") if isinstance(o["usage"], dict) else None
            if usage is None:
                self.note("usage", ConversionStatus.INVALID, "not an object; dropped")
        err = o.get("error")
        return LuxResponse(
            id=self.req_str(o, "id", "response"),
            model=self.req_str(o, "model", "response"),
            choices=[self.choice(c, f"choices[{i}]") for i, c in enumerate(choices)],
            created_at=self.opt_int(o, "created_at", "response"),
            usage=usage,
            provider_payload=o.get("provider_payload"),
            error=self.error(err, "error") if isinstance(err, dict) else None,
        )


def _canonical_tool_results(items: list[ConversationItem]) -> list[ConversationItem]:
    """One ``tool``-role message per tool result, in the order of the calls.

    Reads Anthropic-style ``user`` messages holding ``tool_result`` blocks and
    ``tool`` messages holding several results. Results follow the order of the
    calls in the latest assistant message; ids it does not name keep their order
    after them.
    """
    out: list[ConversationItem] = []
    call_order: dict[str, int] = {}
    run_start = -1  # start of the current run of single-result tool messages in out
    for item in items:
        if type(item) is not Message:
            out.append(item)
            run_start = -1
            continue
        if item.role == Role.ASSISTANT:
            call_order = {c.id: n for n, c in enumerate(
                c for c in item.content if type(c) is ToolUse)}
            out.append(item)
            run_start = -1
            continue
        results = [c for c in item.content if type(c) is ToolResult]
        if not results or item.role not in (Role.TOOL, Role.USER):
            out.append(item)
            run_start = -1
            continue
        if run_start < 0:
            run_start = len(out)
        for r in results:
            out.append(Message(Role.TOOL, [r]))
        rest = [c for c in item.content if type(c) is not ToolResult]
        if call_order:
            big = len(call_order)
            out[run_start:] = sorted(out[run_start:], key=lambda m: call_order.get(_first_result_id(m), big))
        if rest:
            out.append(Message(item.role, rest, item.phase))
            run_start = -1
    return out
