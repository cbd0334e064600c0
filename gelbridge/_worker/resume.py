"""Where a claimed, unfinished reply picks up after a crash (pure; PROTOCOL.md §4.6, §5).

Before a turn runs the auto-run calls of a model step it writes the reply durably
(``streaming``) with those ``toolCallPart``s in it (``ReplyWriter.checkpoint``); progress
writes made while the model streams never hold a tool call of the step in progress. So
every tool call in a stored reply belongs to a finished model step, and its id is the
one the tool journal knows.

:func:`resume_point` reads that stored content back: it keeps the parts up to and
including the last tool call or result (the last complete group of calls, with whatever
results exist), drops what an unfinished model step streamed after it, and sorts the
calls still without a result into those that may run now (auto-run, or approved),
those the user denied, and those waiting for approval. The turn then answers the calls
through the journal (finished → stored result; begun, not finished → ``interrupted``;
never begun → it runs) and continues the tool loop, so a restart never asks the model
again for calls it already made, and never runs one twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gelbridge._records.models import Part, ToolCallPart, ToolResultPart

PENDING = "pending"
APPROVED = "approved"
DENIED = "denied"

DENIED_NOT_RUN = "The tool call was not run: the user denied it."


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """The part of a stored reply a restarted turn keeps, and what is left to do."""

    parts: list[Part]
    to_run: list[ToolCallPart]  # no result yet; auto-run or approved: answer through the journal
    denied: list[ToolCallPart]  # marked denied, no result (never run)
    pending: list[ToolCallPart]  # waiting for the user's approval: the reply ends awaitingApproval
    steps: int  # tool steps already in the reply (groups of consecutive calls/results)


def _is_tool(p: Part) -> bool:
    return type(p) is ToolCallPart or type(p) is ToolResultPart


def tool_steps(parts: Sequence[Part]) -> int:
    """How many groups of consecutive tool calls/results ``parts`` hold: an estimate of
    the tool steps taken (one step's calls form one group; steps without text between
    them merge), used to keep a resumed tool loop within ``[tools] max_steps``."""
    n = 0
    inside = False
    for p in parts:
        if _is_tool(p):
            if not inside:
                n += 1
            inside = True
        else:
            inside = False
    return n


def resume_point(parts: Sequence[Part]) -> ResumePoint | None:
    """The resume point of a stored reply, or None when it holds no tool call (then the
    reply is simply written again from scratch)."""
    last = -1
    for i, p in enumerate(parts):
        if _is_tool(p):
            last = i
    if last < 0 or not any(type(p) is ToolCallPart for p in parts[: last + 1]):
        return None
    kept = list(parts[: last + 1])
    answered = {p.call_id for p in kept if type(p) is ToolResultPart}
    to_run: list[ToolCallPart] = []
    denied: list[ToolCallPart] = []
    pending: list[ToolCallPart] = []
    seen: set[str] = set()
    for p in kept:
        if type(p) is not ToolCallPart or p.call_id in answered or p.call_id in seen:
            continue
        seen.add(p.call_id)
        if p.approval == PENDING:
            pending.append(p)
        elif p.approval == DENIED:
            denied.append(p)
        else:
            to_run.append(p)
    return ResumePoint(kept, to_run, denied, pending, tool_steps(kept))
