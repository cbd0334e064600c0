"""Running tool calls: argument checks and output cutting (pure), then execution.

Every failure becomes an error *result* for the model (``ToolOutcome.is_error``), never
an exception: bad JSON, arguments that miss required keys, an unknown tool, a tool that
needs approval but was not approved, a timeout, a crash. Log lines name the tool, the
kind of failure - never the call id (the provider chose it), a tool name the model
made up, the arguments or the output (all sealed content).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from gelbridge import _tracing as tracing
from gelbridge._tools.registry import ToolOutput, ToolRegistry

log = logging.getLogger("gelbridge.tools")


@dataclass(frozen=True)
class ToolCall:
    """A call the model made. ``input`` is the JSON-encoded arguments string.

    ``approved`` says the user approved it (PROTOCOL.md §5); a call to a tool whose
    policy is ``approval = "always"`` runs only when it is set.
    """

    call_id: str
    tool: str
    input: str
    approved: bool = False


@dataclass(frozen=True)
class ToolOutcome:
    """The result for one call. ``output`` fits in ``max_output_chars``; when the tool
    said more, ``output`` is a summary and ``long_output`` the full text (to be sealed
    into the ``toolResultPart.outputBlob``)."""

    call_id: str
    output: str
    is_error: bool
    long_output: str | None = None
    duration_ms: float = 0.0


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else list(expected)
    for n in names:
        types = _JSON_TYPES.get(n)
        if types is None:
            return True  # a type we do not check
        if isinstance(value, bool) and n in ("integer", "number"):
            continue
        if n == "integer" and isinstance(value, float) and value.is_integer():
            return True
        if isinstance(value, types):
            return True
    return False


def parse_arguments(input_json: str, schema: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Decode the model's argument string and check it against the tool's schema.

    Checks what models get wrong in practice: invalid JSON, a non-object, missing
    ``required`` keys, wrong top-level types, and unexpected keys when the schema says
    ``additionalProperties: false``. Returns ``(arguments, None)`` or ``(None, message)``.
    An empty string means ``{}`` (some providers send that for argument-less tools).
    """
    text = input_json.strip()
    if not text:
        args: Any = {}
    else:
        try:
            args = json.loads(text)
        except json.JSONDecodeError as e:
            return None, f"The arguments are not valid JSON ({e.msg} at position {e.pos}). Send a JSON object."
    if not isinstance(args, dict):
        return None, f"The arguments must be a JSON object, not {type(args).__name__}."
    found = schema.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    missing = [k for k in schema.get("required", []) if k not in args]
    if missing:
        return None, f"Missing required argument(s): {', '.join(missing)}."
    wrong: list[str] = []
    for key, value in args.items():
        sub = props.get(key)
        if isinstance(sub, dict) and "type" in sub and not _type_ok(value, sub["type"]):
            wrong.append(f"{key} should be {sub['type'] if isinstance(sub['type'], str) else ' or '.join(sub['type'])}")
    if wrong:
        return None, f"Wrong argument type(s): {'; '.join(wrong)}."
    if schema.get("additionalProperties") is False:
        extra = [k for k in args if k not in props]
        if extra:
            return None, f"Unknown argument(s): {', '.join(extra)}."
    return args, None


def cut_output(call_id: str, output: ToolOutput, max_chars: int, duration_ms: float = 0.0) -> ToolOutcome:
    """Keep an output within ``max_chars``: the head plus a note, the rest in
    ``long_output``."""
    text = output.text
    if len(text) <= max_chars:
        return ToolOutcome(call_id, text, output.is_error, None, duration_ms)
    note = (
        f"\n\n[output truncated: the first {{n}} of {len(text)} characters are shown; "
        "the full output is attached as a file]"
    )
    keep = max(0, max_chars - len(note.format(n=max_chars)))
    summary = text[:keep] + note.format(n=keep)
    return ToolOutcome(call_id, summary[:max_chars], output.is_error, text, duration_ms)


async def run_one(
    call: ToolCall, registry: ToolRegistry, *, timeout: float, max_output_chars: int
) -> ToolOutcome:
    """Run one call to completion or to an error result. Never raises (except
    cancellation of the caller)."""
    name = call.tool if registry.get(call.tool) is not None else "unknown"  # never a name the model made up
    with tracing.span(f"execute_tool {name}", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                                                "gen_ai.tool.type": "function"}) as sp:
        outcome = await _run_one(call, registry, timeout=timeout, max_output_chars=max_output_chars)
        if sp is not None and outcome.is_error:
            tracing.failed(sp, "tool_error")
        return outcome


async def _run_one(
    call: ToolCall, registry: ToolRegistry, *, timeout: float, max_output_chars: int
) -> ToolOutcome:
    start = time.monotonic()

    def done(out: ToolOutput) -> ToolOutcome:
        return cut_output(call.call_id, out, max_output_chars, (time.monotonic() - start) * 1000)

    tool = registry.get(call.tool)
    if tool is None:
        log.warning("tool call: the model asked for a tool that is not offered; not run")
        return done(ToolOutput(f"Unknown tool {call.tool!r}: it is not available here.", True))
    if tool.approval == "always" and not call.approved:
        log.warning("tool call (%s): needs approval and was not approved, not run", call.tool)
        return done(ToolOutput(f"The tool {call.tool!r} needs the user's approval and was not run.", True))
    args, problem = parse_arguments(call.input, tool.parameters)
    if problem is not None:
        log.info("tool call (%s): bad arguments", call.tool)
        return done(ToolOutput(problem, True))
    assert args is not None
    try:
        out = await asyncio.wait_for(tool.executor(args), timeout=timeout)
    except TimeoutError:
        log.warning("tool call (%s): timed out after %.0f s", call.tool, timeout)
        return done(ToolOutput(f"The tool {call.tool!r} did not answer within {timeout:g} seconds.", True))
    except Exception as e:  # any executor failure becomes a result for the model
        log.warning("tool call (%s): failed with %s", call.tool, type(e).__name__)
        return done(ToolOutput(f"The tool {call.tool!r} failed: {type(e).__name__}: {e}", True))
    if not isinstance(out, ToolOutput):
        log.warning("tool call (%s): executor returned %s", call.tool, type(out).__name__)
        return done(ToolOutput(f"The tool {call.tool!r} returned no usable result.", True))
    return done(out)


async def execute_calls(
    calls: list[ToolCall], registry: ToolRegistry, *, timeout: float, max_output_chars: int
) -> list[ToolOutcome]:
    """Run independent calls in parallel, each bounded by ``timeout``; one outcome per
    call, in the order given."""
    return list(
        await asyncio.gather(
            *(run_one(c, registry, timeout=timeout, max_output_chars=max_output_chars) for c in calls)
        )
    )
