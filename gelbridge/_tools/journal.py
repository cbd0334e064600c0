"""At-most-once execution: ``execute_calls`` behind the state database's tool journal.

For each call that would actually run (known tool, approved if it needs approval):

- first sight (``begin_tool_call`` creates the entry) → run it, then store the result
  sealed (``finish_tool_call``);
- already finished (a regeneration, or a replay after a crash) → reuse the stored
  result, do not run again;
- begun but never finished (the process died while it ran) → do not run again; answer
  with an ``interrupted`` error result and store that, so every later reader agrees.

Sealing is the caller's: ``seal(plaintext) -> (ciphertext, key_id)`` and
``open_(ciphertext, key_id) -> plaintext`` (normally the conversation key, so the
journal holds nothing readable). The sealed payload is UTF-8 JSON
``{"output", "isError", "longOutput"}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from gelbridge._errors import ToolJournalConflict
from gelbridge._state import CallRef, StateStore
from gelbridge._tools.approval import input_digest
from gelbridge._tools.execute import ToolCall, ToolOutcome, execute_calls
from gelbridge._tools.registry import ToolRegistry

log = logging.getLogger("gelbridge.tools.journal")

Seal = Callable[[bytes], tuple[bytes, str]]
Open = Callable[[bytes, str], bytes]

INTERRUPTED_OUTPUT = (
    "The tool call was interrupted (gelbridge stopped while it ran) and was not repeated; "
    "whether it took effect is unknown."
)


def encode_outcome(outcome: ToolOutcome) -> bytes:
    return json.dumps(
        {"output": outcome.output, "isError": outcome.is_error, "longOutput": outcome.long_output},
        ensure_ascii=False,
    ).encode()


def decode_outcome(call_id: str, data: bytes) -> ToolOutcome:
    obj: dict[str, Any] = json.loads(data)
    return ToolOutcome(call_id, str(obj["output"]), bool(obj["isError"]), obj.get("longOutput"))


async def execute_journaled(
    calls: list[ToolCall],
    registry: ToolRegistry,
    store: StateStore,
    *,
    account: str,
    conversation: str,
    reply_rkey: str,
    seal: Seal,
    open_: Open,
    timeout: float,
    max_output_chars: int,
) -> list[ToolOutcome]:
    """Like ``execute_calls`` (one outcome per call, in order), but each call runs at
    most once per state store. A call is ``(account, conversation, call id)``: the same
    id in another conversation or account is another call, never its stored result."""
    results: dict[int, ToolOutcome] = {}
    to_run: list[tuple[int, ToolCall]] = []
    unjournaled: list[tuple[int, ToolCall]] = []
    for i, call in enumerate(calls):
        tool = registry.get(call.tool)
        if tool is None or (tool.approval == "always" and not call.approved):
            unjournaled.append((i, call))  # refused without running: nothing to journal
            continue
        ref = CallRef(account, conversation, call.call_id)
        try:
            entry = await store.begin_tool_call(ref, reply_rkey, call.tool, input_digest(call.tool, call.input))
        except ToolJournalConflict as e:
            log.warning("reply %s: tool call %d: %s", reply_rkey, i, e)
            results[i] = ToolOutcome(call.call_id, f"{e}.", True)
            continue
        if entry.new:
            to_run.append((i, call))
        elif entry.finished and entry.sealed_result is not None and entry.key_id is not None:
            results[i] = decode_outcome(call.call_id, open_(entry.sealed_result, entry.key_id))
        else:
            log.warning("reply %s: tool call %d (%s): interrupted earlier, not run again", reply_rkey, i, call.tool)
            outcome = ToolOutcome(call.call_id, INTERRUPTED_OUTPUT, True)
            sealed, key_id = seal(encode_outcome(outcome))
            stored = await store.finish_tool_call(ref, sealed, key_id, True)  # the first result stored wins
            results[i] = decode_outcome(call.call_id, open_(stored.sealed_result or sealed, stored.key_id or key_id))
    ran = await execute_calls(
        [c for _, c in to_run] + [c for _, c in unjournaled],
        registry,
        timeout=timeout,
        max_output_chars=max_output_chars,
    )
    for (i, _call), outcome in zip(to_run, ran[: len(to_run)]):
        sealed, key_id = seal(encode_outcome(outcome))
        await store.finish_tool_call(CallRef(account, conversation, outcome.call_id), sealed, key_id, outcome.is_error)
        results[i] = outcome
    for (i, _call), outcome in zip(unjournaled, ran[len(to_run):]):
        results[i] = outcome
    return [results[i] for i in range(len(calls))]
