"""At-most-once execution through the state journal, with results stored sealed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gelbridge._state import CallRef, SqliteStore
from gelbridge._tools import Tool, ToolCall, ToolOutput, ToolRegistry
from gelbridge._tools.approval import input_digest
from gelbridge._tools.journal import INTERRUPTED_OUTPUT, execute_journaled

KEY = 0x5A


def seal(data: bytes) -> tuple[bytes, str]:  # stand-in for the conversation key
    return bytes(b ^ KEY for b in data), "test-key"


def open_(data: bytes, key_id: str) -> bytes:
    assert key_id == "test-key"
    return bytes(b ^ KEY for b in data)


def counting_registry(counter: dict[str, int]) -> ToolRegistry:
    async def send(args: dict[str, Any]) -> ToolOutput:
        counter["runs"] += 1
        return ToolOutput(f"sent secret-payload-{args['n']}")

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return ToolRegistry([Tool("send", "Send", schema, send, approval="always")])


async def test_a_call_runs_once_across_regenerations_and_results_are_sealed(tmp_path: Path) -> None:
    counter = {"runs": 0}
    reg = counting_registry(counter)
    call = ToolCall("call_1", "send", '{"n": 1}', approved=True)
    with SqliteStore(tmp_path / "s.db") as store:
        kw = dict(account="did:a", conversation="conv", seal=seal, open_=open_, timeout=5, max_output_chars=1000)
        (first,) = await execute_journaled([call], reg, store, reply_rkey="m.r0", **kw)
        (again,) = await execute_journaled([call], reg, store, reply_rkey="m.r1", **kw)
        assert counter["runs"] == 1
        assert first.output == again.output == "sent secret-payload-1" and not again.is_error
        entry = await store.get_tool_call(CallRef("did:a", "conv", "call_1"))
        assert entry is not None and b"secret-payload" not in (entry.sealed_result or b"")
    for f in tmp_path.iterdir():
        assert b"secret-payload" not in f.read_bytes(), f


async def test_interrupted_call_is_not_rerun(tmp_path: Path) -> None:
    counter = {"runs": 0}
    reg = counting_registry(counter)
    with SqliteStore(tmp_path / "s.db") as store:
        await store.begin_tool_call(CallRef("did:a", "conv", "call_2"), "m.r0", "send",
                              input_digest("send", '{"n": 2}'))  # then "crash"
        calls = [ToolCall("call_2", "send", '{"n": 2}', approved=True), ToolCall("call_3", "send", '{"n": 3}', approved=True)]
        out = await execute_journaled(
            calls, reg, store, account="did:a", conversation="conv", reply_rkey="m.r1", seal=seal, open_=open_,
            timeout=5, max_output_chars=1000,
        )
        assert counter["runs"] == 1
        assert (out[0].output, out[0].is_error) == (INTERRUPTED_OUTPUT, True)
        assert out[1].output == "sent secret-payload-3"
        assert (await store.get_tool_call(CallRef("did:a", "conv", "call_2"))).finished  # type: ignore[union-attr]


async def test_unapproved_unknown_and_conflicting_calls_do_not_run(tmp_path: Path) -> None:
    counter = {"runs": 0}
    reg = counting_registry(counter)
    with SqliteStore(tmp_path / "s.db") as store:
        await store.begin_tool_call(CallRef("did:a", "conv", "reused"), "m.r0", "send", input_digest("send", '{"n": 9}'))
        calls = [
            ToolCall("a", "send", '{"n": 1}'),
            ToolCall("b", "nope", "{}", approved=True),
            ToolCall("reused", "send", '{"n": 1}', approved=True),
        ]
        out = await execute_journaled(
            calls, reg, store, account="did:a", conversation="conv", reply_rkey="m.r1", seal=seal, open_=open_,
            timeout=5, max_output_chars=1000,
        )
        assert counter["runs"] == 0 and all(o.is_error for o in out)
        assert [o.call_id for o in out] == ["a", "b", "reused"]
        assert await store.get_tool_call(CallRef("did:a", "conv", "a")) is None
        assert await store.get_tool_call(CallRef("did:a", "conv", "b")) is None


async def test_one_call_id_in_two_conversations_and_two_accounts_runs_four_times(tmp_path: Path) -> None:
    """Gemini-like providers name every first call alike: each conversation (and account)
    runs its own call with its own input and gets its own result, never another's."""
    counter = {"runs": 0}
    reg = counting_registry(counter)
    with SqliteStore(tmp_path / "s.db") as store:
        got = {}
        for account in ("did:a", "did:b"):
            for conv, n in (("conv1", 1), ("conv2", 2)):
                (out,) = await execute_journaled(
                    [ToolCall("call__0", "send", f'{{"n": {n}}}', approved=True)], reg, store,
                    account=account, conversation=conv, reply_rkey="m.r0", seal=seal, open_=open_,
                    timeout=5, max_output_chars=1000,
                )
                got[account, conv] = (out.output, out.is_error)
        assert counter["runs"] == 4
        assert got == {(a, c): (f"sent secret-payload-{n}", False)
                       for a in ("did:a", "did:b") for c, n in (("conv1", 1), ("conv2", 2))}
        # and within one conversation it is still the same call: no second run
        (again,) = await execute_journaled(
            [ToolCall("call__0", "send", '{"n": 2}', approved=True)], reg, store, account="did:a",
            conversation="conv2", reply_rkey="m.r1", seal=seal, open_=open_, timeout=5, max_output_chars=1000,
        )
        assert counter["runs"] == 4 and again.output == "sent secret-payload-2"
