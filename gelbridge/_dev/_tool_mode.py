"""The local model's tool mode (``gelbridge dev model``): a user message that says
``call <tool>`` makes the model ask for that tool call, and the next request, which
carries the tool's result, is answered with that result. So a tool call and its
approval can be tried by hand with no real model.

What a message may say (``call`` or ``use``, any case, ``the tool`` optional; only
tools the request offers count):

- ``call current_time``: a call with no arguments;
- ``call current_time timezone=Europe/Berlin``: ``key=value`` pairs (a value that is
  JSON, like ``3`` or ``true``, is taken as such);
- ``call fetch_url https://example.com``: one bare value fills the tool's first
  required parameter;
- ``call mcp_files_read_file {"path": "notes.txt"}``: a JSON object is the whole input;
- ``call current_time and call fetch_url https://example.com``: two calls at once.

``use the tool X`` naming a tool the request does not offer is answered with the names
it does offer. Any other message gets the echo answer. Everything here is pure: the
request body in (any provider's shape), a ``Turn`` out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gelbridge._dev._wire_common import ToolCall, Turn, _text_of, echo_turn


#: What the local model answers when nothing is scripted (``gelbridge dev model --mode``):
#: "tools" as described above, "echo" only ever repeats the last user text.
class Mode(StrEnum):
    TOOLS = "tools"
    ECHO = "echo"


#: "call X" / "use X" / "use the tool X"; group 1 is "the tool" when said.
_ASK = re.compile(r"\b(?:call|use)\s+(the\s+tool\s+)?([A-Za-z_][\w.-]*)", re.IGNORECASE)
_PAIR = re.compile(r"^([A-Za-z_][\w-]*)=(.+)$")
_FILLERS = frozenset({"and", "then", "please", "now", "too", "also"})
#: characters of a tool result quoted in the answer
RESULT_CHARS = 600


@dataclass(frozen=True)
class _Result:
    call_id: str
    name: str
    text: str
    is_error: bool


def tool_turn(body: Any) -> Turn:
    """The answer of the tool mode to one request body."""
    results = trailing_results(body)
    if results:
        return Turn(text="\n".join(_quote(r) for r in results))
    text = _last_user_text_or_none(body)
    if text is None:
        return echo_turn(body)
    tools = offered_tools(body)
    calls, unknown = asked_calls(text, tools)
    if calls:
        return Turn(text=f"Calling {', '.join(c.name for c in calls)}.", tool_calls=calls)
    if unknown:
        offered = ", ".join(sorted(tools)) or "none (name some in [defaults] tools)"
        return Turn(text=f"This request offers no tool named {unknown}. Tools offered: {offered}.")
    return echo_turn(body)


def asked_calls(text: str, tools: Mapping[str, Mapping[str, Any]]) -> tuple[list[ToolCall], str | None]:
    """The calls ``text`` asks for, among ``tools`` (name -> JSON schema of its input);
    and the first name asked for as "the tool X" that is not offered."""
    matches = list(_ASK.finditer(text))
    calls: list[ToolCall] = []
    unknown: str | None = None
    for i, m in enumerate(matches):
        name = m.group(2).rstrip(".,;:!?")
        if name not in tools:
            if m.group(1) and unknown is None:
                unknown = name
            continue
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        calls.append(ToolCall(name, _arguments(text[m.end():end], tools[name])))
    return calls, unknown


def _arguments(rest: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    rest = rest.strip()
    if rest.startswith("{"):
        try:
            value, _ = json.JSONDecoder().raw_decode(rest)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
    tokens = rest.split()
    args: dict[str, Any] = {}
    for token in tokens:
        pair = _PAIR.match(token)
        if pair is None:
            break
        args[pair.group(1)] = _value(pair.group(2).rstrip(",;"))
    if args or not tokens:
        return args
    required = schema.get("required")
    bare = tokens[0].rstrip(".,;!?")
    if isinstance(required, list) and required and isinstance(required[0], str) and bare \
            and bare.lower() not in _FILLERS:
        args[required[0]] = bare
    return args


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _quote(r: _Result) -> str:
    text = " ".join(r.text.split())
    if len(text) > RESULT_CHARS:
        text = f"{text[:RESULT_CHARS]}… ({len(r.text)} characters in all)"
    return f"{r.name} {'failed' if r.is_error else 'returned'}: {text}"


# ------------------------------------------------------------------ reading any provider's request


def offered_tools(body: Any) -> dict[str, Mapping[str, Any]]:
    """Function tools of a request, name -> input schema: OpenAI Chat Completions and
    Ollama (``function``), Responses (``type: function``), Anthropic (``input_schema``),
    Gemini (``functionDeclarations``). Provider-native tools (web search) have no name
    here and are left out."""
    out: dict[str, Mapping[str, Any]] = {}
    tools = body.get("tools") if isinstance(body, Mapping) else None
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        decls = tool.get("functionDeclarations", tool.get("function_declarations"))
        for d in decls if isinstance(decls, list) else [tool.get("function", tool)]:
            if isinstance(d, Mapping) and isinstance(d.get("name"), str):
                schema: Mapping[str, Any] = next((d[k] for k in ("parameters", "input_schema", "parametersJsonSchema",
                                              "parameters_json_schema") if isinstance(d.get(k), Mapping)), {})
                out[d["name"]] = schema
    return out


def _items(body: Any) -> list[Any]:
    if not isinstance(body, Mapping):
        return []
    for key in ("messages", "contents", "input"):
        items = body.get(key)
        if isinstance(items, list):
            return items
    return []


def _events(body: Any) -> list[tuple[str, Any]]:
    """The conversation as ("user", text) / ("call", (id, name)) / ("result", _Result)
    events, in order, whatever the provider's shape."""
    if isinstance(body, Mapping) and isinstance(body.get("input"), str):  # Responses' short form
        return [("user", body["input"])]
    events: list[tuple[str, Any]] = []
    for item in _items(body):
        if not isinstance(item, Mapping):
            continue
        kind, role = item.get("type"), item.get("role")
        if kind == "function_call":  # Responses
            events.append(("call", (str(item.get("call_id", "")), str(item.get("name", "")))))
        elif kind == "function_call_output":
            events.append(("result", _Result(str(item.get("call_id", "")), "", _text(item.get("output")), False)))
        elif role == "tool":  # Chat Completions, Ollama
            name = item.get("tool_name") or item.get("name") or ""
            events.append(("result", _Result(str(item.get("tool_call_id", "")), str(name),
                                             _text(item.get("content")), False)))
        else:
            for call in item.get("tool_calls") or ():  # Chat Completions, Ollama
                if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                    events.append(("call", (str(call.get("id", "")), str(call["function"].get("name", "")))))
            content = item.get("content", item.get("parts"))
            events += _block_events(content, role in (None, "user"))
    return events


def _block_events(content: Any, from_user: bool) -> list[tuple[str, Any]]:
    if isinstance(content, str):
        return [("user", content)] if from_user and content else []
    events: list[tuple[str, Any]] = []
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        fc, fr = block.get("functionCall"), block.get("functionResponse")  # Gemini
        if block.get("type") == "tool_use":  # Anthropic
            events.append(("call", (str(block.get("id", "")), str(block.get("name", "")))))
        elif block.get("type") == "tool_result":
            events.append(("result", _Result(str(block.get("tool_use_id", "")), "", _text(block.get("content")),
                                             bool(block.get("is_error")))))
        elif isinstance(fc, Mapping):
            events.append(("call", (str(fc.get("id", "")), str(fc.get("name", "")))))
        elif isinstance(fr, Mapping):
            response = fr.get("response")
            error = isinstance(response, Mapping) and "error" in response and "output" not in response
            if isinstance(response, Mapping) and len(response) == 1 and isinstance(next(iter(response.values())), str):
                text = str(next(iter(response.values())))
            else:
                text = json.dumps(response, ensure_ascii=False)
            events.append(("result", _Result(str(fr.get("id", "")), str(fr.get("name", "")), text, error)))
        elif from_user and not block.get("thought"):
            texts.append(_text_of(block))
    joined = "\n".join(t for t in texts if t)
    return events + ([("user", joined)] if joined else [])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (_text_of(p) for p in content) if t)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def trailing_results(body: Any) -> list[_Result]:
    """The tool results the request ends with (after its last user text), each named
    after its call; empty when the request ends with a user text."""
    events = _events(body)
    names = {value[0]: value[1] for kind, value in events if kind == "call" and value[0]}
    results: list[_Result] = []
    for kind, value in reversed(events):
        if kind == "user":
            break
        if kind == "result":
            results.append(value)
    return [_Result(r.call_id, r.name or names.get(r.call_id, r.call_id or "the tool"), r.text, r.is_error)
            for r in reversed(results)]


def _last_user_text_or_none(body: Any) -> str | None:
    texts: Sequence[str] = [value for kind, value in _events(body) if kind == "user"]
    return texts[-1] if texts else None
