"""Record parts ⇄ ``gelbridge._tools.approval`` (PROTOCOL.md §5), pure.

``waiting_calls`` reads the parent reply, ``approval_answers`` the user's answer,
``resolve_approvals`` (tools package) decides, and ``repeated_call_parts`` writes the
start of the new reply: each waiting call again, marked ``approved``/``denied``, each
followed by its result. ``build_request`` then puts those in place of the waiting
copies, so every history has exactly one result per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gelbridge._records.models import Part, ToolApprovalPart, ToolCallPart, ToolResultPart
from gelbridge._tools.approval import ApprovalAnswer, ApprovalOutcome, WaitingCall, denial_output

PENDING = "pending"
APPROVED = "approved"
DENIED = "denied"


def _result_ids(parts: Sequence[Part]) -> set[str]:
    return {p.call_id for p in parts if type(p) is ToolResultPart}


def waiting_call_parts(reply_parts: Sequence[Part]) -> list[ToolCallPart]:
    """The ``toolCallPart``s of a reply with ``approval: pending`` and no result, in order."""
    done = _result_ids(reply_parts)
    return [
        p for p in reply_parts
        if type(p) is ToolCallPart and p.approval == PENDING and p.call_id not in done
    ]


def waiting_calls(reply_parts: Sequence[Part]) -> list[WaitingCall]:
    """The calls of a reply that wait for the user's approval."""
    return [WaitingCall(p.call_id, p.tool, p.input, p.source or "") for p in waiting_call_parts(reply_parts)]


def approval_answers(user_parts: Sequence[Part]) -> list[ApprovalAnswer]:
    """Every ``toolApprovalPart`` of the user's message, in order."""
    return [
        ApprovalAnswer(p.call_id, p.approved, p.reason)
        for p in user_parts
        if type(p) is ToolApprovalPart
    ]


def repeated_call_parts(
    outcome: ApprovalOutcome,
    results: Mapping[str, ToolResultPart],
    *,
    parent_parts: Sequence[Part] = (),
) -> list[Part]:
    """The leading parts of the reply to an approval message.

    For each resolution, in the parent's order: the call again (same callId, tool,
    input, source; ``providerData`` from the waiting copy in ``parent_parts``) marked
    ``approved``/``denied``, then its result: a denial's is ``isError`` with
    ``denial_output``; an approved call's is ``results[callId]`` (left out while the
    tool has not run; ``build_request`` then reports it and answers it as not run).
    """
    originals = {p.call_id: p for p in parent_parts if type(p) is ToolCallPart}
    out: list[Part] = []
    for r in outcome.resolutions:
        c = r.call
        orig = originals.get(c.call_id)
        out.append(ToolCallPart(
            call_id=c.call_id,
            tool=c.tool,
            input=c.input,
            source=c.source,
            approval=APPROVED if r.approved else DENIED,
            provider_data=orig.provider_data if orig is not None else None,
        ))
        if not r.approved:
            out.append(ToolResultPart(call_id=c.call_id, output=denial_output(r), is_error=True))
        else:
            res = results.get(c.call_id)
            if res is not None:
                if res.call_id != c.call_id:
                    res = res.model_copy(update={"call_id": c.call_id})
                out.append(res)
    return out
