"""walk_thread: the parent chain, the branch the user picked, and every error."""

from __future__ import annotations

import pytest

from gelbridge._errors import (
    ForeignConversationError,
    MissingRecordError,
    RecordError,
    ThreadCycleError,
    ThreadTooDeepError,
)
from gelbridge._records import GenerationRequest
from gelbridge._thread import previous_reply_rkey, walk_thread
from testkit.mapping_builders import reply, user  # noqa: E402


def three_turns() -> dict:
    return {
        "a": user(None),
        "a.r0": reply("a"),
        "a.r1": reply("a"),  # a regeneration: another branch
        "b": user("a.r1"),
        "b.r0": reply("b"),
        "c": user("b.r0"),
    }


def test_walk_returns_oldest_first_along_the_chosen_branch() -> None:
    t = walk_thread("c", three_turns())
    assert t.rkeys == ["a", "a.r1", "b", "b.r0", "c"]
    assert t.message.rkey == "c"
    assert t.parent_reply is not None and t.parent_reply.rkey == "b.r0"
    assert t.conversation == "3mconvconvcv2"


def test_other_attempts_are_not_in_the_thread() -> None:
    recs = three_turns()
    recs["b"] = user("a.r0")
    assert walk_thread("c", recs).rkeys == ["a", "a.r0", "b", "b.r0", "c"]


def test_first_message_alone() -> None:
    t = walk_thread("a", {"a": user(None)})
    assert t.rkeys == ["a"] and t.parent_reply is None


def test_lookup_may_be_a_callable_and_is_asked_only_for_the_chain() -> None:
    recs = three_turns()
    asked: list[str] = []

    def get(k: str):
        asked.append(k)
        return recs.get(k)

    walk_thread("c", get)
    assert asked == ["c", "b.r0", "b", "a.r1", "a"]


def test_missing_message() -> None:
    with pytest.raises(MissingRecordError) as e:
        walk_thread("zzz", {})
    assert e.value.rkey == "zzz"


def test_missing_parent_names_it_and_who_points_to_it() -> None:
    recs = three_turns()
    del recs["b"]
    with pytest.raises(MissingRecordError) as e:
        walk_thread("c", recs)
    assert e.value.rkey == "b" and e.value.referenced_by == "b.r0"
    assert "b.r0" in str(e.value) and "record b," in str(e.value)
    assert e.value.kind == "bad_record"


def test_cycle() -> None:
    # a's parent is c.r0 (whose parent is c): c → b.r0 → b → a.r1 → a → c.r0 → c
    recs = three_turns()
    recs["a"] = user("c.r0")
    recs["c.r0"] = reply("c")
    with pytest.raises(ThreadCycleError) as e:
        walk_thread("c", recs)
    assert "c.r0" in str(e.value)


def test_branch_into_another_conversation() -> None:
    recs = three_turns()
    recs["b"] = user("a.r1", conversation="3motherconvv2")
    with pytest.raises(ForeignConversationError) as e:
        walk_thread("c", recs)
    assert "3motherconvv2" in str(e.value)


def test_too_deep() -> None:
    recs = {"m0": user(None)}
    for i in range(1, 30):
        recs[f"m{i - 1}.r0"] = reply(f"m{i - 1}")
        recs[f"m{i}"] = user(f"m{i - 1}.r0")
    assert len(walk_thread("m29", recs, max_depth=59)) == 59
    with pytest.raises(ThreadTooDeepError) as e:
        walk_thread("m29", recs, max_depth=58)
    assert "58" in str(e.value)


@pytest.mark.parametrize(
    "records, start, words",
    [
        ({"x": reply("w")}, "x", "only user messages"),
        ({"c": user("b")}, "c", "not a reply key"),
        ({"c": user("b.r0"), "b.r0": reply("q")}, "c", "must be the message it answers"),
        ({"c": user("b.r0"), "b.r0": reply("b"), "b": reply("a")}, "c", "expected user"),
        ({"c": user("b.r0"), "b.r0": user("b")}, "c", "expected assistant"),
        ({"c": user("b.r0"), "b.r0": reply("b").model_copy(update={"role": "system"})}, "c", "expected assistant"),
        ({"c": user("b.r0"), "b.r0": reply(None)}, "c", "must be the message it answers"),  # type: ignore[arg-type]
    ],
)
def test_malformed_chains_are_record_errors(records: dict, start: str, words: str) -> None:
    with pytest.raises(RecordError) as e:
        walk_thread(start, records)
    assert words in str(e.value)


def test_a_valid_chain_through_several_branches_checks_roles_and_keys() -> None:
    recs = {"c": user("b.r2"), "b.r2": reply("b"), "b": user("zz.r0"), "zz.r0": reply("zz"), "zz": user(None)}
    assert walk_thread("c", recs).rkeys == ["zz", "zz.r0", "b", "b.r2", "c"]


def test_previous_reply_for_first_attempt_and_regeneration() -> None:
    assert previous_reply_rkey("c", user("b.r0")) == "b.r0"
    assert previous_reply_rkey("c", user("b.r0", generation=GenerationRequest(attempt=3))) == "c.r2"
    assert previous_reply_rkey("a", user(None)) is None


def test_thread_entries_are_immutable_values() -> None:
    t = walk_thread("c", three_turns())
    e = t.entries[0]
    with pytest.raises(AttributeError):
        e.rkey = "x"  # type: ignore[misc]
    rkey, record = e
    assert (rkey, record) == (e.rkey, e.record) == ("a", three_turns()["a"])
