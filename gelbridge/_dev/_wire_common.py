"""Provider-neutral script of what the local model answers, plus pure helpers.

A test queues `Turn`s (and failure items) on a `ModelServer`; every provider route
renders the same item in its own wire format, so one script drives any adapter.
Everything here is pure: no I/O, no clocks, no globals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Neutral finish reasons understood by every renderer. Any other string is passed
#: through unchanged to the provider field (to test adapters against odd values).
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_TOOL_CALLS = "tool_calls"
FINISH_CONTENT_FILTER = "content_filter"


@dataclass(frozen=True)
class ToolCall:
    """One function call the model makes; `arguments` is a JSON object (dict)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Citation:
    """A web page the answer cites (provider-native web search)."""

    url: str
    title: str = ""
    cited_text: str = ""


@dataclass(frozen=True)
class Turn:
    """One scripted model answer.

    - `reasoning`: visible reasoning/thinking text (Anthropic thinking block, OpenAI
      `reasoning_content`, Gemini `thought: true` part, Ollama `thinking`).
    - `reasoning_signature`: opaque signature (Anthropic `signature`, Gemini
      `thoughtSignature`); a signature with empty `reasoning` yields an empty signed
      thinking block on Anthropic. It is sent verbatim; Gemini signatures are bytes
      (base64 in JSON), so use base64 text when the google-genai SDK must decode it.
    - `redacted_reasoning`: opaque data of an Anthropic `redacted_thinking` block (other
      providers have no equivalent and ignore it).
    - `usage`: `(input_tokens, output_tokens, reasoning_tokens)`; output includes
      reasoning, as OpenAI/Anthropic count it (Gemini's candidatesTokenCount is
      rendered as output - reasoning). None: estimated from the text lengths.
    - `finish`: neutral finish reason; None means `tool_calls` when there are tool
      calls, else `stop`.
    - `chunk_size`: characters per streamed text/argument fragment (None: server
      default). `chunk_delay`: seconds slept between streamed frames.
    - `searches` / `citations`: the provider's own web search ran these queries and the
      text cites these pages (Anthropic server tool blocks and text citations, OpenAI
      Responses web_search_call items and url_citation annotations, Gemini grounding
      metadata; the other providers ignore them).
    """

    text: str = ""
    reasoning: str = ""
    reasoning_signature: str | None = None
    redacted_reasoning: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    usage: tuple[int, int, int] | None = None
    finish: str | None = None
    chunk_size: int | None = None
    chunk_delay: float = 0.0
    searches: Sequence[str] = ()
    citations: Sequence[Citation] = ()


@dataclass(frozen=True)
class Fail:
    """Answer with an HTTP error in the provider's error shape (and Retry-After)."""

    status: int = 500
    message: str = "scripted failure"
    retry_after: float | None = None
    code: str | None = None  # the provider's error code, where its error shape has one (OpenAI's)


@dataclass(frozen=True)
class MalformedBody:
    """Answer 200 with a body that is not valid JSON (a single bad frame when streaming)."""

    body: str = '{"malformed": '


@dataclass(frozen=True)
class CutStream:
    """Serve `turn` (default: the echo answer) but drop the connection after
    `after_chunks` frames (non-stream: after half of the body)."""

    after_chunks: int = 1
    turn: Turn | None = None


@dataclass(frozen=True)
class MidStreamError:
    """Stream `after_chunks` frames of `turn`, then an in-stream error event in the
    provider's shape (Anthropic `event: error`, OpenAI/Gemini `data: {"error":..}`,
    Ollama `{"error": ..}` line). Non-stream requests get a plain `Fail(status)`."""

    after_chunks: int = 1
    status: int = 529
    message: str = "scripted mid-stream error"
    turn: Turn | None = None


@dataclass(frozen=True)
class Delay:
    """Wait `seconds` (interrupted by server stop), then serve `then` (default: echo)."""

    seconds: float
    then: Turn | Fail | MalformedBody | CutStream | MidStreamError | None = None


Item = Turn | Fail | MalformedBody | CutStream | MidStreamError | Delay
#: A script is simply the FIFO sequence of items the server answers with.
Script = Sequence[Item]


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class WireContext:
    """Everything a renderer needs besides the turn; built once per request."""

    model: str
    seq: int  # per-server request number, used for deterministic ids
    created: int  # unix seconds
    prompt_text: str
    chunk_size: int
    include_usage: bool = False  # OpenAI stream_options.include_usage
    openai_reasoning_field: str = "reasoning_content"
    gemini_call_ids: bool = True
    reasoning_details: bool = False  # OpenRouter's reasoning_details on OpenAI-format answers
    encrypted_reasoning: bool = False  # Responses: include ["reasoning.encrypted_content"]
    request_tools: tuple[Any, ...] = ()  # Responses: echoed in the response object
    cached_tokens: int = 0  # input tokens the server's prompt cache served (usage)
    cache_write_tokens: int = 0  # input tokens written to it (Anthropic)
    prompt_tokens: int | None = None  # the prompt's size when the cache rules counted it


# ---------------------------------------------------------------- pure helpers


def chunks(text: str, size: int) -> list[str]:
    """Split `text` into pieces of at most `size` characters (none for "")."""
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def arguments_json(call: ToolCall) -> str:
    """Compact JSON of the call's arguments; a zero-argument call is `{}`."""
    return json.dumps(dict(call.arguments), separators=(",", ":"), ensure_ascii=False)


def estimate_tokens(text: str) -> int:
    """Deterministic rough token count (4 characters per token, at least 1)."""
    return max(1, (len(text) + 3) // 4)


def resolve_usage(turn: Turn, prompt_text: str, prompt_tokens: int | None = None) -> Usage:
    """The turn's scripted usage, else an estimate (``prompt_tokens``: the prompt's size
    as the prompt-cache rules counted it, when they did)."""
    if turn.usage is not None:
        i, o, r = turn.usage
        return Usage(i, o, r)
    reasoning = (len(turn.reasoning) + 3) // 4
    generated = turn.text + "".join(arguments_json(c) + c.name for c in turn.tool_calls)
    prompt = prompt_tokens if prompt_tokens is not None else estimate_tokens(prompt_text)
    return Usage(prompt, estimate_tokens(generated) + reasoning, reasoning)


def resolve_finish(turn: Turn) -> str:
    if turn.finish:
        return turn.finish
    return FINISH_TOOL_CALLS if turn.tool_calls else FINISH_STOP


def call_id(call: ToolCall, prefix: str, seq: int, index: int) -> str:
    return call.id if call.id else f"{prefix}{seq:06d}_{index}"


def _text_of(content: Any, *, allow_tool_results: bool = False) -> str:
    """Text of a message content in any provider's shape (str, block list, parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        text = content.get("text")
        if isinstance(text, str) and not content.get("thought"):
            return text
        if allow_tool_results and content.get("type") == "tool_result":
            return _text_of(content.get("content"))
        return ""
    if isinstance(content, list):
        texts = [_text_of(p, allow_tool_results=allow_tool_results) for p in content]
        return "\n".join(t for t in texts if t)
    return ""


def last_user_text(body: Any) -> str:
    """The last user-authored text of a request in OpenAI (Chat Completions or
    Responses), Anthropic, Gemini or Ollama shape; "" when there is none. Tolerates any
    malformed input."""
    if not isinstance(body, Mapping):
        return ""
    if isinstance(body.get("input"), str):
        return str(body["input"])
    messages = body.get("messages")
    if not isinstance(messages, list):
        messages = body.get("contents")
    if not isinstance(messages, list):
        messages = body.get("input")
    if not isinstance(messages, list):
        return _text_of(body.get("prompt")) if "prompt" in body else ""
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("role", "user") != "user":
            continue
        text = _text_of(message.get("content", message.get("parts")))
        if text:
            return text
    return ""


def echo_turn(body: Any) -> Turn:
    """The default deterministic model: repeat the last user text."""
    return Turn(text=f"You said: {last_user_text(body)}")


def prompt_text(body: Any) -> str:
    """All text of the request, used only to estimate input tokens."""
    if not isinstance(body, Mapping):
        return ""
    parts: list[str] = []
    system = (body.get("system") or body.get("systemInstruction") or body.get("system_instruction")
              or body.get("instructions"))
    if system:
        parts.append(_text_of(system if not isinstance(system, Mapping) else system.get("parts", system)))
    items = body.get("messages") or body.get("contents") or body.get("input") or []
    if isinstance(items, str):
        items = [{"content": items}]
    for message in items if isinstance(items, list) else []:
        if isinstance(message, Mapping):
            parts.append(
                _text_of(message.get("content", message.get("parts", message.get("output"))), allow_tool_results=True)
            )
    return "\n".join(p for p in parts if p)
