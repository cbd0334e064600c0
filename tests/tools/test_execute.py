"""Executing calls: argument checks, policy, timeouts, output cutting, parallelism."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from gelbridge._tools import (
    Tool,
    ToolCall,
    ToolOutput,
    ToolRegistry,
    cut_output,
    execute_calls,
    needs_approval,
    parse_arguments,
)

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "integer"}, "s": {"type": "string"}},
    "required": ["a"],
}


def make_registry() -> ToolRegistry:
    async def add(args: dict[str, Any]) -> ToolOutput:
        return ToolOutput(str(args["a"] + args.get("b", 0)))

    async def sleepy(args: dict[str, Any]) -> ToolOutput:
        await asyncio.sleep(args["a"])
        return ToolOutput("slept")

    async def broken(args: dict[str, Any]) -> ToolOutput:
        raise RuntimeError("disk on fire")

    async def big(args: dict[str, Any]) -> ToolOutput:
        return ToolOutput("x" * 5000 + "END")

    async def wrong_type(args: dict[str, Any]) -> Any:
        return "not a ToolOutput"

    return ToolRegistry(
        [
            Tool("add", "Add", SCHEMA, add),
            Tool("sleepy", "Sleep", SCHEMA, sleepy),
            Tool("broken", "Fails", {"type": "object"}, broken),
            Tool("big", "Big", {"type": "object"}, big),
            Tool("wrong_type", "Bad executor", {"type": "object"}, wrong_type),
            Tool("guarded", "Needs approval", SCHEMA, add, approval="always", source="https://mcp.example/"),
        ]
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"a": 1', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"b": 1}', "Missing required argument(s): a"),
        ('{"a": "one"}', "a should be number"),
        ('{"a": 1, "b": 1.5}', "b should be integer"),
        ('{"a": true}', "a should be number"),
    ],
)
def test_bad_arguments_are_explained(text: str, problem: str) -> None:
    args, message = parse_arguments(text, SCHEMA)
    assert args is None and message is not None and problem in message


def test_good_arguments_and_empty_input() -> None:
    assert parse_arguments('{"a": 1, "b": 2.0, "extra": 1}', SCHEMA) == ({"a": 1, "b": 2.0, "extra": 1}, None)
    assert parse_arguments("", {"type": "object"}) == ({}, None)
    strict = {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": False}
    assert parse_arguments('{"y": 1}', strict)[1] == "Unknown argument(s): y."


def test_cut_output_keeps_short_and_summarises_long() -> None:
    short = cut_output("c", ToolOutput("hello"), 100)
    assert (short.output, short.long_output) == ("hello", None)
    long = cut_output("c", ToolOutput("a" * 1000, is_error=True), 200)
    assert len(long.output) <= 200 and long.output.startswith("aaa") and "truncated" in long.output
    assert long.long_output == "a" * 1000 and long.is_error


async def test_results_errors_and_policy() -> None:
    reg = make_registry()
    calls = [
        ToolCall("1", "add", '{"a": 2, "b": 3}'),
        ToolCall("2", "add", '{"a": '),
        ToolCall("3", "nope", "{}"),
        ToolCall("4", "broken", "{}"),
        ToolCall("5", "guarded", '{"a": 1}'),
        ToolCall("6", "guarded", '{"a": 1}', approved=True),
        ToolCall("7", "big", "{}"),
        ToolCall("8", "wrong_type", "{}"),
    ]
    out = await execute_calls(calls, reg, timeout=5, max_output_chars=1000)
    assert [o.call_id for o in out] == [c.call_id for c in calls]
    by = {o.call_id: o for o in out}
    assert (by["1"].output, by["1"].is_error) == ("5", False)
    assert by["2"].is_error and "not valid JSON" in by["2"].output
    assert by["3"].is_error and "Unknown tool" in by["3"].output
    assert by["4"].is_error and "disk on fire" in by["4"].output
    assert by["5"].is_error and "approval" in by["5"].output
    assert (by["6"].output, by["6"].is_error) == ("1", False)
    assert len(by["7"].output) <= 1000 and by["7"].long_output is not None and by["7"].long_output.endswith("END")
    assert by["8"].is_error


async def test_timeout_is_an_error_result() -> None:
    start = time.monotonic()
    (out,) = await execute_calls([ToolCall("t", "sleepy", '{"a": 30}')], make_registry(), timeout=0.3, max_output_chars=100)
    assert out.is_error and "did not answer within 0.3 seconds" in out.output
    assert time.monotonic() - start < 5


async def test_independent_calls_run_in_parallel() -> None:
    calls = [ToolCall(str(i), "sleepy", json.dumps({"a": 0.5})) for i in range(6)]
    start = time.monotonic()
    out = await execute_calls(calls, make_registry(), timeout=10, max_output_chars=100)
    elapsed = time.monotonic() - start
    assert all(o.output == "slept" for o in out)
    assert elapsed < 1.5, f"6 x 0.5 s calls took {elapsed:.2f} s: not parallel"
    assert all(o.duration_ms >= 450 for o in out)


def test_registry_select_specs_and_approval_policy() -> None:
    reg = make_registry()
    tools, unknown = reg.select(["add", "web_search", "guarded", "add"])
    assert [t.name for t in tools] == ["add", "guarded"] and unknown == ["web_search"]
    assert reg.specs(["add"]) == [{"name": "add", "description": "Add", "parameters": SCHEMA}]
    assert not needs_approval("add", reg) and needs_approval("guarded", reg) and needs_approval("nope", reg)
    with pytest.raises(ValueError):
        reg.register(Tool("add", "dup", {}, reg.get("add").executor))  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        Tool("has space", "", {}, reg.get("add").executor)  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        Tool("x" * 129, "", {}, reg.get("add").executor)  # type: ignore[union-attr]
