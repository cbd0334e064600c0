"""Lux IR ⇄ the two adapter formats (pure: no Lua, no I/O).

``completion`` (the default; ``/work/shared/spec/ADAPTER.md`` exactly):
  ``lux_to_completion_request`` builds the CompletionRequest a script receives;
  ``completion_response_to_lux`` reads the CompletionResponse it returns;
  ``CompletionChunkDecoder`` turns its StreamChunks into Lux stream events.
``lux-ir-v1`` (opt-in, ``adapter.format = "lux-ir-v1"``):
  ``lux_request_for_adapter`` gives the script the Lux IR request itself (foreign
  provider data stripped, call ids mapped); ``lux_response_from_adapter`` and
  ``LuxEventDecoder`` read its Lux IR response / stream events and fill the
  ``provider_data`` tags it left empty.

Everything that cannot be carried is reported as a ``Diagnostic`` (never content).
See docs/adapters.md for the field-by-field tables.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from gelbridge._adapters.ids import ToolCallIdMap, map_tool_call_ids
from gelbridge._errors import AdapterError
from gelbridge.lux import (
    BlockDelta,
    BlockDiscard,
    BlockEnd,
    BlockStart,
    Choice,
    ConversionStatus,
    Converted,
    Diagnostic,
    DoneEvent,
    ErrorEvent,
    FinishEvent,
    FinishReason,
    LuxDecodeError,
    LuxError,
    LuxRequest,
    LuxResponse,
    Media,
    Message,
    ProviderData,
    ProviderDataDelta,
    Refusal,
    Role,
    StreamEvent,
    Text,
    TextDelta,
    Thinking,
    ThinkingDelta,
    ToolArgumentsDelta,
    ToolCallStart,
    ToolResult,
    ToolUse,
    Usage,
    UsageEvent,
    decode_response,
    event_from_json,
    normalize_error_kind,
    strip_foreign_provider_data,
)
from gelbridge.lux._models import read_plain_response, request_json

if TYPE_CHECKING:
    from gelbridge._adapters.sandbox import TextPiece

COMPLETION_FORMAT = "completion"
LUX_FORMAT = "lux-ir-v1"
FORMATS = (COMPLETION_FORMAT, LUX_FORMAT)

_DEG = ConversionStatus.DEGRADED
_UNS = ConversionStatus.UNSUPPORTED
_INV = ConversionStatus.INVALID

#: CompletionRequest keys the host writes itself; ``options.extras`` cannot replace them.
_OWN_KEYS = frozenset({"model", "messages", "temperature", "max_tokens", "stream", "tools",
                       "tool_choice", "disable_thinking"})


def _dumps(v: Any) -> str:
    return orjson.dumps(v).decode()


# ======================================================================================
# completion format: request
# ======================================================================================


def _data_url(m: Media) -> str | None:
    if m.source.type == "inline":
        return f"data:{m.media_type};base64,{m.source.data}"
    if m.source.type == "url":
        return m.source.data
    return None


def _media_block(m: Media, path: str, diags: list[Diagnostic]) -> dict[str, Any] | None:
    url = _data_url(m)
    if url is None:
        diags.append(Diagnostic(path, _UNS, f"{m.kind} given as {m.source.type}; the completion "
                                            "format carries only data: and http(s) URLs"))
        return None
    if m.kind == "image":
        return {"type": "image_url", "image_url": {"url": url}}
    if m.kind == "audio":
        return {"type": "audio_url", "audio_url": {"url": url}}
    diags.append(Diagnostic(path, _UNS, f"{m.kind} blocks are not part of the completion format"))
    return None


def _user_content(blocks: list[Any], path: str, diags: list[Diagnostic]) -> str | list[dict[str, Any]]:
    """A string when there is only text (what most scripts expect), else ContentBlocks."""
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    media = False
    for j, b in enumerate(blocks):
        p = f"{path}[{j}]"
        if type(b) is Text:
            texts.append(b.text)
            parts.append({"type": "text", "text": b.text})
            if b.annotations:
                diags.append(Diagnostic(f"{p}.annotations", _UNS, "annotations are not sent"))
        elif type(b) is Media:
            block = _media_block(b, p, diags)
            if block is not None:
                parts.append(block)
                media = True
        elif type(b) is Refusal:
            texts.append(b.refusal)
            parts.append({"type": "text", "text": b.refusal})
            diags.append(Diagnostic(p, _DEG, "refusal sent as text"))
        else:
            diags.append(Diagnostic(p, _UNS, f"{_kind(b)} block in a {path.split('.')[0]} message "
                                             "is not part of the completion format"))
    if media:
        return parts
    return "\n\n".join(texts)


def _kind(b: Any) -> str:
    t = type(b)
    if type(b) is Media:
        return b.kind
    return {Text: "text", Thinking: "thinking", ToolUse: "tool_use", ToolResult: "tool_result",
            Refusal: "refusal"}.get(t, getattr(b, "tag", t.__name__.lower()))


def _result_text(r: ToolResult, path: str, diags: list[Diagnostic]) -> str:
    texts = []
    for j, c in enumerate(r.content):
        if type(c) is Text:
            texts.append(c.text)
        else:
            diags.append(Diagnostic(f"{path}.tool_result.content[{j}]", _UNS,
                                    f"{_kind(c)} in a tool result; tool messages carry text only"))
    if r.is_error:
        diags.append(Diagnostic(f"{path}.tool_result.is_error", _DEG,
                                "the completion format has no error flag on tool messages"))
    return "\n\n".join(texts)


def _assistant(msg: Message, path: str, provider: str, model: str,
               diags: list[Diagnostic]) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(msg.content):
        p = f"{path}[{j}]"
        if type(b) is Text:
            texts.append(b.text)
            if b.provider_data is not None:
                diags.append(Diagnostic(f"{p}.provider_data", _UNS,
                                        "provider data is not part of the completion format"))
        elif type(b) is Thinking:
            pd = b.provider_data
            own = pd is not None and pd.owned_by(provider, model)
            if b.redacted:
                diags.append(Diagnostic(p, _UNS, "redacted thinking cannot be sent in the completion format"))
                continue
            if own and b.text:
                reasoning.append(b.text)
            elif b.text:
                diags.append(Diagnostic(p, _DEG, "thinking not sent: reasoning_content goes back only "
                                                 "to the provider and model that produced it"))
            if b.signature is not None or (own and pd is not None and pd.data):
                diags.append(Diagnostic(f"{p}.provider_data", _UNS, "thinking signatures and provider "
                                                                    "data are not part of the completion format"))
        elif type(b) is ToolUse:
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": b.arguments or "{}"}})
            if b.provider_data is not None:
                diags.append(Diagnostic(f"{p}.provider_data", _UNS,
                                        "provider data is not part of the completion format"))
        elif type(b) is Refusal:
            texts.append(b.refusal)
            diags.append(Diagnostic(p, _DEG, "refusal sent as text"))
        elif type(b) is Media:
            diags.append(Diagnostic(p, _UNS, f"{b.kind} in an assistant message is not part of the "
                                             "completion format"))
        else:
            diags.append(Diagnostic(p, _UNS, f"{_kind(b)} block in an assistant message is not part "
                                             "of the completion format"))
    out: dict[str, Any] = {"role": "assistant"}
    text = "".join(texts)
    out["content"] = None if (calls and not text) else text
    if reasoning:
        out["reasoning_content"] = "\n\n".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _tools(req: LuxRequest, diags: list[Diagnostic]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(req.tools or []):
        if tool.kind != "function":
            diags.append(Diagnostic(f"tools[{i}]", _UNS, f"{tool.kind} tools are not part of the "
                                                         "completion format (function tools only)"))
            continue
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.parameters
        if tool.strict is not None:
            fn["strict"] = tool.strict
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(req: LuxRequest, diags: list[Diagnostic]) -> Any:
    tc = req.tool_choice
    if tc is None:
        return None
    if tc.mode in ("auto", "none", "required"):
        return tc.mode
    if tc.mode == "specific_tool" and tc.name:
        return {"type": "function", "function": {"name": tc.name}}
    diags.append(Diagnostic("tool_choice", _UNS, f"tool choice {tc.mode!r} not carried; auto used"))
    return None


def _thinking_disabled(req: LuxRequest) -> bool:
    r = req.reasoning
    return r is not None and (not r.enabled or r.effort == "none")


def lux_to_completion_request(
    req: LuxRequest, *, provider: str, model: str, id_map: ToolCallIdMap | None = None
) -> Converted[dict[str, Any]]:
    """The CompletionRequest (ADAPTER.md) for ``req``, sent to ``provider``/``model``.

    Opaque state not produced by exactly this provider+model is stripped first;
    ``reasoning_content`` is sent only for thinking this provider+model produced.
    ``id_map`` rewrites call ids to the adapter's rule (calls and results alike).
    """
    diags: list[Diagnostic] = []
    req, stripped = strip_foreign_provider_data(req, provider, model)
    diags += stripped
    if id_map is not None:
        req = map_tool_call_ids(req, id_map)
    messages: list[dict[str, Any]] = []
    if req.instructions:
        texts = []
        for j, b in enumerate(req.instructions):
            if type(b) is Text:
                texts.append(b.text)
            else:
                diags.append(Diagnostic(f"instructions[{j}]", _UNS,
                                        f"{_kind(b)} in instructions; system messages carry text only"))
        if texts:
            messages.append({"role": "system", "content": "\n\n".join(texts)})
    for i, item in enumerate(req.conversation):
        path = f"conversation[{i}].message.content"
        if not isinstance(item, Message):
            diags.append(Diagnostic(f"conversation[{i}]", _UNS,
                                    f"agent action ({item.kind}) is not part of the completion format"))
            continue
        role = str(item.role)
        if role in ("assistant", "model"):
            messages.append(_assistant(item, path, provider, model, diags))
            continue
        results = [(j, b) for j, b in enumerate(item.content) if type(b) is ToolResult]
        others = [b for b in item.content if type(b) is not ToolResult]
        for j, r in results:
            messages.append({"role": "tool", "tool_call_id": r.tool_use_id,
                             "content": _result_text(r, f"{path}[{j}]", diags)})
        if role == "tool":
            for j, b in enumerate(item.content):
                if type(b) is not ToolResult:
                    diags.append(Diagnostic(f"{path}[{j}]", _UNS, f"{_kind(b)} in a tool message left out"))
            continue
        if results and not others:
            continue
        if role in ("system", "developer"):
            if role == "developer":
                diags.append(Diagnostic(f"conversation[{i}].message.role", _DEG,
                                        "developer message sent as a system message"))
            content = _user_content(others, path, diags)
            messages.append({"role": "system", "content": content})
            continue
        if role != "user":
            diags.append(Diagnostic(f"conversation[{i}].message.role", _DEG,
                                    f"role {role!r} sent as user"))
        messages.append({"role": "user", "content": _user_content(others, path, diags)})

    body: dict[str, Any] = {"model": model, "messages": messages}
    o = req.options
    if o.temperature is not None:
        body["temperature"] = o.temperature
    if o.max_output_tokens is not None:
        body["max_tokens"] = o.max_output_tokens
    body["stream"] = bool(o.stream)
    tools = _tools(req, diags)
    if tools:
        body["tools"] = tools
    tc = _tool_choice(req, diags)
    if tc is not None:
        body["tool_choice"] = tc
    body["disable_thinking"] = _thinking_disabled(req)
    rc = req.reasoning
    if rc is not None and rc.enabled and (rc.effort is not None or rc.budget_tokens is not None):
        diags.append(Diagnostic("reasoning", _DEG, "reasoning effort/budget is not part of the "
                                                   "completion format; only disable_thinking is sent"))
    # The Go host merges ExtraBody keys at the top level; these are the standard ones.
    for key in ("top_p", "top_k", "stop", "seed", "store"):
        v = getattr(o, key)
        if v is not None:
            body[key] = v
    if o.candidate_count not in (None, 1):
        diags.append(Diagnostic("options.candidate_count", _UNS, "one choice only"))
    if o.structured_output is not None and o.structured_output.type != "text":
        diags.append(Diagnostic("options.structured_output", _UNS,
                                "structured output is not part of the completion format"))
    for k, v in (o.extras or {}).items():
        if k in _OWN_KEYS:
            diags.append(Diagnostic(f"options.extras.{k}", _INV, "would replace a CompletionRequest field; ignored"))
        else:
            body[k] = v
    if req.extra:
        diags.append(Diagnostic("extra", _UNS, "request.extra is not sent; use options.extras"))
    return Converted(body, diags)


# ======================================================================================
# completion format: response and stream chunks
# ======================================================================================

_FINISH_ALIASES: dict[str, str] = {
    "stop": FinishReason.STOP, "end_turn": FinishReason.STOP, "stop_sequence": FinishReason.STOP,
    "eos": FinishReason.STOP, "complete": FinishReason.STOP, "STOP": FinishReason.STOP,
    "FINISH_REASON_STOP": FinishReason.STOP, "pause_turn": FinishReason.STOP,
    "length": FinishReason.LENGTH, "max_tokens": FinishReason.LENGTH, "MAX_TOKENS": FinishReason.LENGTH,
    "model_length": FinishReason.LENGTH, "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS, "tool_use": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS, "tool_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER, "refusal": FinishReason.CONTENT_FILTER,
    "safety": FinishReason.SAFETY, "SAFETY": FinishReason.SAFETY,
    "PROHIBITED_CONTENT": FinishReason.SAFETY, "BLOCKLIST": FinishReason.SAFETY, "SPII": FinishReason.SAFETY,
    "recitation": FinishReason.RECITATION, "RECITATION": FinishReason.RECITATION,
    "malformed_tool_call": FinishReason.MALFORMED_TOOL_CALL,
    "malformed_function_call": FinishReason.MALFORMED_TOOL_CALL,
    "MALFORMED_FUNCTION_CALL": FinishReason.MALFORMED_TOOL_CALL,
    "error": FinishReason.ERROR,
}


def map_finish(value: Any, diags: list[Diagnostic], path: str = "finish_reason") -> str | None:
    """A script's finish reason → Lux (provider vocabularies tolerated); None if absent."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        diags.append(Diagnostic(path, _INV, "not a string; ignored"))
        return None
    got = _FINISH_ALIASES.get(value) or _FINISH_ALIASES.get(value.lower())
    if got is None:
        diags.append(Diagnostic(path, _DEG, f"unknown finish reason {value[:40]!r} kept as is"))
        return value
    return got


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return max(0, v)
    if isinstance(v, float) and v.is_integer():
        return max(0, int(v))
    return None


def map_usage(u: Any, diags: list[Diagnostic], path: str = "token_usage") -> Usage | None:
    """``token_usage``/``usage`` ``{prompt, completion, total, reasoning_tokens?, cache_read?}``
    → Lux usage (OpenAI-style ``*_tokens`` names are read too)."""
    if u is None:
        return None
    if not isinstance(u, dict):
        diags.append(Diagnostic(path, _INV, "not an object; dropped"))
        return None

    def get(*keys: str) -> int | None:
        for k in keys:
            if k in u and u[k] is not None:
                v = _int(u[k])
                if v is None:
                    diags.append(Diagnostic(f"{path}.{k}", _INV, "not an integer; dropped"))
                return v
        return None

    prompt = get("prompt", "prompt_tokens", "input_tokens") or 0
    completion = get("completion", "completion_tokens", "output_tokens") or 0
    total = get("total", "total_tokens")
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=max(total or 0, prompt + completion),
        reasoning_tokens=get("reasoning_tokens", "reasoning"),
        cached_tokens=get("cache_read", "cached_tokens"),
    )


def _args_text(v: Any, path: str, diags: list[Diagnostic]) -> str:
    """Tool arguments (object, or a JSON string) → compact JSON text."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and set(v) == {"raw"} and isinstance(v["raw"], str):
        # HomeAgent adapters send {raw=<text>} when the provider's arguments were not JSON.
        diags.append(Diagnostic(path, _INV, "arguments were not JSON ({raw=...}); kept as sent"))
        return v["raw"]
    if isinstance(v, (dict, list)):
        if isinstance(v, list) and not v:
            return "{}"  # an empty Lua table may encode as [] (json.encode on an unmarked table)
        return _dumps(v)
    diags.append(Diagnostic(path, _INV, f"arguments of type {type(v).__name__}; wrapped as {{value: ...}}"))
    return _dumps({"value": v})


def _flat_call(c: Any, path: str, diags: list[Diagnostic]) -> tuple[str, str, Any]:
    """(id, name, arguments) of a flat call, tolerating the nested OpenAI shape."""
    cid = c.get("id")
    name = c.get("name")
    args = c.get("arguments")
    fn = c.get("function")
    if isinstance(fn, dict):
        if not name and isinstance(fn.get("name"), str):
            name = fn["name"]
        if args is None and "arguments" in fn:
            args = fn["arguments"]
        diags.append(Diagnostic(path, _INV, "nested function{name, arguments} read; ADAPTER.md wants flat "
                                            "name/arguments"))
    return (cid if isinstance(cid, str) else ("" if cid is None else str(cid)),
            name if isinstance(name, str) else "", args)


def completion_response_to_lux(obj: Any, *, provider: str, model: str) -> Converted[LuxResponse]:
    """A CompletionResponse (what ``transform_response`` returned, decoded) → Lux response.

    Blocks in order: thinking (``reasoning_content``, tagged with provider+model so it
    can go back to them), text, tool calls. ``model`` is the requested model id.
    Raises ``AdapterError`` when ``obj`` is not an object.
    """
    if not isinstance(obj, dict):
        raise AdapterError(f"transform_response returned JSON {type(obj).__name__}, not a "
                           "CompletionResponse object")
    diags: list[Diagnostic] = []
    content: list[Any] = []
    rc = obj.get("reasoning_content")
    if isinstance(rc, str) and rc:
        content.append(Thinking(rc, provider_data=ProviderData(provider, model, {})))
    elif rc is not None and not isinstance(rc, str):
        diags.append(Diagnostic("reasoning_content", _INV, "not a string; dropped"))
    text = obj.get("content")
    if isinstance(text, str):
        if text:
            content.append(Text(text))
    elif text is not None:
        diags.append(Diagnostic("content", _INV, "not a string; dropped"))
    calls = obj.get("tool_calls")
    n_calls = 0
    if isinstance(calls, list):
        for i, c in enumerate(calls):
            p = f"tool_calls[{i}]"
            if not isinstance(c, dict):
                diags.append(Diagnostic(p, _INV, "not an object; dropped"))
                continue
            cid, name, args = _flat_call(c, p, diags)
            if not name:
                diags.append(Diagnostic(p, _INV, "tool call without a name dropped"))
                continue
            arguments = _args_text(args, f"{p}.arguments", diags) or "{}"
            _check_json(arguments, f"{p}.arguments", diags)
            content.append(ToolUse(cid, name, arguments))
            n_calls += 1
    elif isinstance(calls, dict) and not calls:
        pass  # an empty Lua table encoded as {}: no calls
    elif calls is not None:
        diags.append(Diagnostic("tool_calls", _INV, "not an array; dropped"))
    finish = map_finish(obj.get("finish_reason"), diags)
    if finish is None:
        finish = FinishReason.TOOL_CALLS if n_calls else FinishReason.STOP
    usage_src = obj.get("token_usage", obj.get("usage"))
    usage = map_usage(usage_src, diags, "token_usage")
    return Converted(
        LuxResponse(id=str(obj.get("id") or ""), model=model,
                    choices=[Choice(0, Message(Role.ASSISTANT, content), finish)], usage=usage),
        diags,
    )


def _check_json(text: str, path: str, diags: list[Diagnostic]) -> None:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        diags.append(Diagnostic(path, _INV, "arguments are not valid JSON; kept as sent"))


class CompletionChunkDecoder:
    """StreamChunks (ADAPTER.md + the Go host's real fields) → Lux stream events.

    - ``content`` → text deltas, ``reasoning_content`` → thinking deltas; a switch
      between them (or a tool piece in between) starts a new block, so order is kept.
    - ``tool_calls`` (flat pieces) are bucketed by ``stream_index``: the first piece of
      a bucket starts a tool-call block, later non-empty ``id``/``name`` overwrite,
      ``raw_arguments`` (or string ``arguments``) are appended, object ``arguments``
      replace. ``index`` instead of ``stream_index`` and nested ``function{}`` are read
      with an ``invalid`` diagnostic; a missing index means the piece's position in the
      array. A piece at index 0 with no id, name or arguments is skipped (Go rule).
    - ``tool_call`` (singular): a new non-empty ``id`` starts a new call, otherwise the
      piece continues the current one.
    - ``usage``/``token_usage`` → usage events (merged by maximum downstream).
    - ``finish_reason`` → a finish event (provider vocabularies mapped); ``done`` is
      remembered. ``error`` (extension: ``{message, kind?}`` or a string) → error event.

    ``finish()`` closes open blocks and, when no finish reason came, infers
    ``tool_calls`` (a named call arrived) or ``stop``. Block indices: 0, 1, 2... in the
    order blocks start.
    """

    __slots__ = ("provider", "model", "diagnostics", "_next", "_run_kind", "_run_index",
                 "_buckets", "_single", "_single_id", "_has_args", "_named", "finish_reason",
                 "done", "events_out", "_single_n")

    def __init__(self, *, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.diagnostics: list[Diagnostic] = []
        self._next = 0
        self._run_kind: str | None = None
        self._run_index = -1
        self._buckets: dict[tuple[str, int], int] = {}
        self._single: int | None = None
        self._single_id = ""
        self._single_n = 0
        self._has_args: set[int] = set()
        self._named: set[int] = set()
        self.finish_reason: str | None = None
        self.done = False
        self.events_out = 0

    def _note(self, field_: str, status: ConversionStatus, detail: str) -> None:
        d = Diagnostic(field_, status, detail)
        if d not in self.diagnostics:
            self.diagnostics.append(d)

    def _new_index(self) -> int:
        i = self._next
        self._next += 1
        return i

    def _run(self, kind: str, out: list[StreamEvent]) -> int:
        if self._run_kind == kind:
            return self._run_index
        if self._run_kind is not None:
            out.append(BlockEnd(self._run_index))
        idx = self._new_index()
        self._run_kind, self._run_index = kind, idx
        out.append(BlockStart(idx, kind))
        if kind == "thinking":
            # reasoning_content may go back only to this provider+model: tag it
            out.append(BlockDelta(idx, ProviderDataDelta(ProviderData(self.provider, self.model, {}))))
        return idx

    def _end_run(self, out: list[StreamEvent]) -> None:
        if self._run_kind is not None:
            out.append(BlockEnd(self._run_index))
            self._run_kind = None

    def decode(self, chunk: Any) -> list[StreamEvent]:
        """Events for one StreamChunk (already JSON-decoded)."""
        if not isinstance(chunk, dict):
            self._note("chunk", _INV, f"stream chunk is JSON {type(chunk).__name__}, not an object; skipped")
            return []
        out: list[StreamEvent] = []
        get = chunk.get
        rc = get("reasoning_content")
        if rc:
            if isinstance(rc, str):
                out.append(BlockDelta(self._run("thinking", out), ThinkingDelta(rc)))
            else:
                self._note("chunk.reasoning_content", _INV, "not a string; dropped")
        text = get("content")
        if text:
            if isinstance(text, str):
                out.append(BlockDelta(self._run("text", out), TextDelta(text)))
            else:
                self._note("chunk.content", _INV, "not a string; dropped")
        calls = get("tool_calls")
        if calls:
            if isinstance(calls, list):
                for pos, piece in enumerate(calls):
                    self._plural(piece, pos, out)
            elif not isinstance(calls, dict):  # {} is an empty Lua table
                self._note("chunk.tool_calls", _INV, "not an array; dropped")
        single = get("tool_call")
        if single:
            if isinstance(single, dict):
                self._singular(single, out)
            else:
                self._note("chunk.tool_call", _INV, "not an object; dropped")
        usage = get("usage")
        if usage is None:
            usage = get("token_usage")
        if usage:
            diags: list[Diagnostic] = []
            u = map_usage(usage, diags, "chunk.usage")
            for d in diags:
                self._note(d.field, d.status, d.detail or "")
            if u is not None:
                out.append(UsageEvent(u))
        fr = get("finish_reason")
        if fr:
            diags = []
            mapped = map_finish(fr, diags, "chunk.finish_reason")
            for d in diags:
                self._note(d.field, d.status, d.detail or "")
            if mapped is not None:
                self.finish_reason = mapped
                out.append(FinishEvent(mapped))
        err = get("error")
        if err:
            out.append(ErrorEvent(_error_of(err)))
        if get("done") is True:
            self.done = True
        self.events_out += len(out)
        return out

    def _start_call(self, key: tuple[str, int], cid: str, name: str, out: list[StreamEvent]) -> int:
        self._end_run(out)
        idx = self._new_index()
        self._buckets[key] = idx
        out.append(BlockStart(idx, ToolCallStart(cid, name)))
        if name:
            self._named.add(idx)
        return idx

    def _args(self, idx: int, args: Any, path: str, out: list[StreamEvent], raw: bool) -> None:
        if args is None or args == "":
            return
        if isinstance(args, str):
            out.append(BlockDelta(idx, ToolArgumentsDelta(args)))
            self._has_args.add(idx)
            return
        diags: list[Diagnostic] = []
        text = _args_text(args, path, diags)
        for d in diags:
            self._note(d.field, d.status, d.detail or "")
        if raw:
            self._note(path, _INV, "raw_arguments is not a string; read as whole arguments")
        if idx in self._has_args:
            out.append(BlockDiscard(idx))  # whole arguments replace the pieces so far
        out.append(BlockDelta(idx, ToolArgumentsDelta(text)))
        self._has_args.add(idx)

    def _plural(self, piece: Any, pos: int, out: list[StreamEvent]) -> None:
        path = "chunk.tool_calls[]"
        if not isinstance(piece, dict):
            self._note(path, _INV, "tool call piece is not an object; dropped")
            return
        si = piece.get("stream_index")
        if si is None and "index" in piece:
            si = piece.get("index")
            self._note(f"{path}.index", _INV, "'index' read as stream_index (ADAPTER.md pieces use stream_index)")
        if si is None:
            si = pos
            self._note(f"{path}.stream_index", _DEG, "missing; the piece's position in the array used")
        si = _int(si)
        if si is None:
            self._note(f"{path}.stream_index", _INV, "not an integer; piece dropped")
            return
        cid, name, args = _flat_call(piece, path, [])
        if isinstance(piece.get("function"), dict):
            self._note(f"{path}.function", _INV, "nested function{name, arguments} read; ADAPTER.md pieces "
                                                 "are flat (name, raw_arguments)")
        raw = piece.get("raw_arguments")
        key = ("p", si)
        idx = self._buckets.get(key)
        if idx is None:
            if si == 0 and not cid and not name and raw in (None, "") and args in (None, ""):
                return
            idx = self._start_call(key, cid, name, out)
        elif cid or name:
            out.append(BlockStart(idx, ToolCallStart(cid, name)))
            if name:
                self._named.add(idx)
        if raw is not None:
            self._args(idx, raw, f"{path}.raw_arguments", out, raw=True)
        if args is not None:
            self._args(idx, args, f"{path}.arguments", out, raw=False)

    def _singular(self, piece: dict[str, Any], out: list[StreamEvent]) -> None:
        path = "chunk.tool_call"
        cid, name, args = _flat_call(piece, path, [])
        if isinstance(piece.get("function"), dict):
            self._note(f"{path}.function", _INV, "nested function{name, arguments} read; ADAPTER.md wants "
                                                 "flat name/arguments")
        if args is None and piece.get("raw_arguments") is not None:
            args = piece.get("raw_arguments")
        if self._single is None or (cid and cid != self._single_id):
            if not cid and not name and args in (None, ""):
                return
            self._single_n += 1
            self._single = self._start_call(("s", self._single_n), cid, name, out)
            self._single_id = cid
        elif cid or name:
            out.append(BlockStart(self._single, ToolCallStart(cid, name)))
            if name:
                self._named.add(self._single)
        self._args(self._single, args, f"{path}.arguments", out, raw=False)

    def finish(self) -> list[StreamEvent]:
        """Close what is open; a finish event when none came (inferred)."""
        out: list[StreamEvent] = []
        self._end_run(out)
        for idx in sorted(self._buckets.values()):
            out.append(BlockEnd(idx))
        if self.finish_reason is None:
            self.finish_reason = FinishReason.TOOL_CALLS if self._named else FinishReason.STOP
            out.append(FinishEvent(self.finish_reason))
        out.append(DoneEvent())
        return out


def _error_of(err: Any) -> LuxError:
    if isinstance(err, dict):
        msg = err.get("message")
        kind = err.get("kind") or err.get("type") or err.get("code") or "server_error"
        return LuxError(normalize_error_kind(str(kind)), msg if isinstance(msg, str) else "stream error")
    return LuxError("server_error", err if isinstance(err, str) else "stream error")


# ======================================================================================
# lux-ir-v1 format
# ======================================================================================


def lux_request_for_adapter(
    req: LuxRequest, *, provider: str, model: str, id_map: ToolCallIdMap | None = None
) -> Converted[dict[str, Any]]:
    """The Lux IR request JSON a ``lux-ir-v1`` script receives: provider data not
    produced by exactly ``provider``/``model`` stripped, call ids mapped."""
    # Ids are mapped and the model set while writing the JSON (no copy of the request):
    # the same map, in the same order, as ``map_tool_call_ids``. The writer also checks
    # that no block holds state foreign to provider+model (the mapping stripped it
    # already for the same pair); only when one does is the request stripped (with its
    # diagnostics) and written again. Stripping never removes a call or a result, so
    # the id map sees the same ids in the same order on the second pass.
    map_id = id_map.map if id_map is not None and id_map.rule is not None else None
    wire = request_json(req, model=model, map_id=map_id, owner=(provider, model))
    if wire is not None:
        return Converted(wire, [])
    stripped, diags = strip_foreign_provider_data(req, provider, model)
    return Converted(request_json(stripped, model=model, map_id=map_id), list(diags))  # type: ignore[arg-type]


def _fill_pd(pd: Any, provider: str, model: str) -> None:
    if isinstance(pd, dict):
        if not pd.get("provider"):
            pd["provider"] = provider
        if not pd.get("model"):
            pd["model"] = model
        if pd.get("data") is None:
            pd["data"] = {}


def _fill_block_tags(block: Any, provider: str, model: str) -> None:
    if not isinstance(block, dict):
        return
    if "provider_data" in block:
        _fill_pd(block["provider_data"], provider, model)
    for key in ("thinking", "tool_use", "text"):
        inner = block.get(key)
        if isinstance(inner, dict) and "provider_data" in inner:
            _fill_pd(inner["provider_data"], provider, model)


def lux_response_from_adapter(obj: Any, *, provider: str, model: str) -> Converted[LuxResponse]:
    """A ``lux-ir-v1`` script's response JSON (decoded) → ``LuxResponse``.

    Empty ``provider``/``model`` in provider_data are filled with the provider name and
    the requested model id; an untagged signature or redacted thinking gets that tag
    too. A response without ``model`` gets the requested one. Raises ``AdapterError``
    when required fields are missing.
    """
    if not isinstance(obj, dict):
        raise AdapterError(f"transform_response returned JSON {type(obj).__name__}, not a Lux IR response")
    obj.setdefault("schema_version", "v1")
    if not obj.get("model"):
        obj["model"] = model
    if obj.get("id") is None:
        obj["id"] = ""
    plain = read_plain_response(obj, (provider, model))  # one pass for the usual answer
    if plain is not None:
        return Converted(plain, [])
    for ch in obj.get("choices") or []:
        msg = ch.get("message") if isinstance(ch, dict) else None
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for b in content:
                _fill_block_tags(b, provider, model)
    try:
        conv = decode_response(obj)
    except LuxDecodeError as e:
        raise AdapterError(f"transform_response returned an invalid Lux IR response: {e}") from None
    resp = conv.value
    for ch in resp.choices:
        new = []
        for b in ch.message.content:
            if type(b) is Thinking and b.provider_data is None and (b.signature is not None or b.redacted):
                b = replace(b, provider_data=ProviderData(provider, model, {}))
            new.append(b)
        ch.message.content[:] = new
    return Converted(resp, list(conv.diagnostics))


_TEXT_DELTAS: dict[str, type] = {"text": TextDelta, "thinking": ThinkingDelta}


class LuxEventDecoder:
    """A ``lux-ir-v1`` script's ``transform_stream_chunk`` output (one event object or an
    array of them, already JSON-decoded) → typed events. Bad events are skipped with an
    ``invalid`` diagnostic (never silently)."""

    __slots__ = ("provider", "model", "diagnostics", "done", "finish_reason", "events_out")

    def __init__(self, *, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self.diagnostics: list[Diagnostic] = []
        self.done = False
        self.finish_reason: str | None = None
        self.events_out = 0

    def decode(self, value: Any) -> list[StreamEvent]:
        items = value if type(value) is list else (value,)
        out: list[StreamEvent] = []
        for o in items:
            if type(o) is dict and o.get("event") == "block_delta":
                d = o.get("delta")
                if type(d) is dict:
                    # Fast path for the bulk of a stream (text/thinking deltas): what
                    # event_from_json would build, without its generic dispatch.
                    dt = d.get("type")
                    cls = _TEXT_DELTAS.get(dt) if type(dt) is str else None
                    if cls is not None:
                        idx, text = o.get("index"), d.get("text")
                        if type(idx) is int and type(text) is str:
                            out.append(BlockDelta(idx, cls(text)))
                            continue
                    elif dt == "provider_data":
                        _fill_pd(d.get("provider_data"), self.provider, self.model)
            try:
                ev = event_from_json(o)
            except LuxDecodeError as e:
                d = Diagnostic(f"stream.{e.path}" if getattr(e, "path", None) else "stream.event", _INV,
                               "event from the adapter could not be read; skipped")
                if d not in self.diagnostics:
                    self.diagnostics.append(d)
                continue
            if type(ev) is DoneEvent:
                self.done = True
            elif type(ev) is FinishEvent:
                self.finish_reason = ev.finish_reason
            out.append(ev)
        self.events_out += len(out)
        return out

    def piece(self, piece: TextPiece) -> list[StreamEvent]:
        """The one text or thinking delta that ``luxkit`` encoded for a chunk (what
        ``decode`` gives for that JSON; ``LuaSandbox.open_stream``)."""
        self.events_out += 1
        return [BlockDelta(piece[1], _TEXT_DELTAS[piece[0]](piece[2]))]

    def finish(self) -> list[StreamEvent]:
        return [] if self.done else [DoneEvent()]


def loads_json(text: str, what: str) -> Any:
    """Decode a script's JSON output, or raise ``AdapterError`` naming the function."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            return json.loads(text)  # NaN/Infinity and other lenient forms
        except ValueError:
            raise AdapterError(f"{what} returned text that is not JSON ({len(text)} characters)") from None


__all__ = [
    "COMPLETION_FORMAT", "FORMATS", "LUX_FORMAT", "CompletionChunkDecoder", "LuxEventDecoder",
    "completion_response_to_lux", "loads_json", "lux_request_for_adapter",
    "lux_response_from_adapter", "lux_to_completion_request", "map_finish", "map_usage",
]
