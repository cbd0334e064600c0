"""Property tests: random conversation trees with regenerations and approvals.

For any tree, the request built for the last message's thread holds the branch the
parent links chose, oldest first; every call has exactly one result; no waiting copy
survives next to its repeated call; and the request is schema-valid.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gelbridge._mapping import build_request, waiting_calls
from gelbridge._records import GenerationRequest, PlainContent
from gelbridge._thread import walk_thread
from testkit.mapping_builders import (
    approve,
    assert_valid_request,
    call,
    check_tool_pairs,
    messages,
    opened,
    reply,
    result,
    text,
    user,
)


@st.composite
def trees(draw):
    records: dict = {}
    contents: dict = {}
    branch: list[str] = []
    parent: str | None = None
    waiting: list = []
    n_turns = draw(st.integers(1, 5))
    for turn in range(n_turns):
        key = f"m{turn}"
        parts = []
        if draw(st.booleans()) or not waiting:
            parts.append(text(f"user-{turn}"))
        answers = {}
        for w in waiting:
            how = draw(st.sampled_from(["yes", "no", "skip"]))
            if how != "skip":
                parts.append(approve(w.call_id, how == "yes"))
                answers[w.call_id] = how == "yes"
        if draw(st.booleans()):
            parts.append(approve(f"ghost{turn}"))
        attempts = draw(st.integers(1, 3)) if turn < n_turns - 1 else 0
        records[key] = user(parent, generation=GenerationRequest(attempt=max(0, attempts - 1)))
        contents[key] = parts
        branch.append(key)
        if turn == n_turns - 1:
            break
        replies = []
        for a in range(attempts):
            rkey = f"{key}.r{a}"
            rparts = []
            # repeated calls first, unless this attempt crashed before writing them
            if waiting and draw(st.booleans()):
                for w in waiting:
                    ok = answers.get(w.call_id, False)
                    rparts.append(call(w.call_id, w.tool, w.input, "approved" if ok else "denied"))
                    rparts.append(result(w.call_id, f"res-{w.call_id}-{a}", not ok))
            for s in range(draw(st.integers(0, 3))):
                kind = draw(st.sampled_from(["text", "done", "pending", "crashed"]))
                cid = f"c{turn}_{a}_{s}"
                if kind == "text":
                    rparts.append(text(f"reply-{rkey}-{s}"))
                elif kind == "done":
                    rparts += [call(cid), result(cid)]
                elif kind == "pending":
                    rparts.append(call(cid, approval="pending"))
                else:
                    rparts.append(call(cid))
            status = draw(st.sampled_from(["complete", "error", "cancelled"]))
            records[rkey] = reply(key, status=status)
            contents[rkey] = rparts
            replies.append(rkey)
        parent = draw(st.sampled_from(replies))
        branch.append(parent)
        waiting = waiting_calls(contents[parent])
    return records, contents, branch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_requests_from_random_trees_keep_every_invariant(tree) -> None:
    records, contents, branch = tree
    thread = walk_thread(branch[-1], records)
    assert thread.rkeys == branch
    msgs = [opened(e.rkey, e.record, *contents[e.rkey]) for e in thread.entries]
    conv = build_request(msgs, provider="p", model="m")
    wire = conv.value.to_json()
    assert_valid_request(wire)
    check_tool_pairs(wire)
    ms = messages(wire)
    # no empty messages, no approval content, user texts oldest first
    assert all(m["content"] for m in ms)
    users = [c["text"] for m in ms if m["role"] == "user" for c in m["content"]]
    assert users == sorted(users, key=lambda s: int(s.split("-")[1]))
    # a waiting call that was repeated carries the repeated call's result
    for i in range(1, len(branch) - 1, 2):
        nxt = branch[i + 2] if i + 2 < len(branch) else None
        if nxt is None:
            continue
        repeated = {p.call_id: p for p in contents[nxt] if p.type.endswith("toolResultPart")}
        for w in waiting_calls(contents[branch[i]]):
            if w.call_id in repeated:
                got = [m["content"][0]["tool_result"] for m in ms if m["role"] == "tool"
                       and m["content"][0]["tool_result"]["tool_use_id"] == w.call_id]
                assert [g["content"][0]["text"] for g in got] == [repeated[w.call_id].output]
    # the input records are lexicon-valid content
    for k in branch:
        PlainContent(parts=contents[k])
