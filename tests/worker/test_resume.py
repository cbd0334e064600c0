"""Resuming an unfinished reply after a crash: which stored parts are kept, which calls
still need an answer, and the writer's unthrottled checkpoint before tools run."""

from __future__ import annotations

import asyncio

from gelbridge._records import MessageRecord, TextPart, ToolCallPart, ToolResultPart
from gelbridge._records.models import ReasoningPart
from gelbridge._sealing import Keyring, content_of
from gelbridge._worker.repo import RepoView
from gelbridge._worker.resume import resume_point, tool_steps
from gelbridge._worker.writer import ReplyWriter
from testkit.worker_fakes import DID, Clock, FakePds


def call(cid: str, approval: str | None = None) -> ToolCallPart:
    return ToolCallPart(call_id=cid, tool="t", input="{}", approval=approval)


def result(cid: str) -> ToolResultPart:
    return ToolResultPart(call_id=cid, output="ok")


def test_a_reply_without_tool_calls_has_no_resume_point() -> None:
    assert resume_point([]) is None
    assert resume_point([ReasoningPart(text="hm"), TextPart(text="partial")]) is None
    assert resume_point([result("stray")]) is None  # a result alone names no call


def test_keeps_the_last_group_of_calls_and_drops_the_unfinished_step_after_it() -> None:
    parts = [TextPart(text="let me"), call("a"), result("a"), TextPart(text="now b"), call("b"), call("c"),
             result("c"), ReasoningPart(text="thinking about"), TextPart(text="the answ")]
    point = resume_point(parts)
    assert point is not None
    assert point.parts == parts[:7]  # up to and including c's result; the partial step is gone
    assert [c.call_id for c in point.to_run] == ["b"]  # a and c have results
    assert point.pending == [] and point.denied == [] and point.steps == 2


def test_calls_written_before_they_ran_are_all_to_run() -> None:
    parts = [TextPart(text="two lookups"), call("a"), call("b")]  # the checkpoint before the tools
    point = resume_point(parts)
    assert point is not None and point.parts == parts
    assert [c.call_id for c in point.to_run] == ["a", "b"] and point.steps == 1


def test_pending_calls_keep_waiting_denied_ones_never_run_approved_ones_run() -> None:
    parts = [call("n1", "approved"), call("n2", "denied"), result("n2"), call("n3", "denied"),
             call("l1"), call("p1", "pending")]
    point = resume_point(parts)
    assert point is not None
    assert [c.call_id for c in point.to_run] == ["n1", "l1"]
    assert [c.call_id for c in point.denied] == ["n3"]
    assert [c.call_id for c in point.pending] == ["p1"]


def test_tool_steps_counts_groups_of_consecutive_calls_and_results() -> None:
    assert tool_steps([]) == 0
    assert tool_steps([call("a"), result("a"), TextPart(text="x"), call("b"), result("b")]) == 2
    assert tool_steps([call("a"), result("a"), call("b"), result("b")]) == 1  # no text between: merged


async def test_checkpoint_writes_now_despite_the_throttle_and_after_a_progress_write_in_flight() -> None:
    pds = FakePds()
    kr = Keyring()
    kid = kr.add_new("k1")
    clock = Clock()
    w = ReplyWriter(pds, RepoView(pds, DID), reply_rkey="3mk.r0", message_rkey="3mk", conversation="3mc",
                    key_id=kid, keyring=kr, update_interval=2.0, clock=clock)
    await w.claim()
    clock.t = 2.5
    w.maybe_progress(lambda: [TextPart(text="older")])  # scheduled, not yet written
    await w.checkpoint([TextPart(text="newer"), call("a")])  # within the throttle window: still written
    assert [p[1]["status"] for p in pds.puts] == ["pending", "streaming", "streaming"]
    rec = MessageRecord.from_value(pds.records["3mk.r0"][1])
    opened = content_of(rec.content, uri=f"at://{DID}/chat.gel.assistant.message/3mk.r0", keyring=kr)
    assert [type(p).__name__ for p in opened.parts] == ["TextPart", "ToolCallPart"]  # the last write wins
    assert w.checkpoints == 1
    w.update_interval = 0  # "final write only" does not turn checkpoints off
    await w.checkpoint([TextPart(text="newer"), call("a"), result("a"), call("b")])
    assert len(pds.puts) == 4
    await asyncio.sleep(0)
