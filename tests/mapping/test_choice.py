"""choose_turn: the PROTOCOL.md §4.3 fallback order for model, tools and effort."""

from __future__ import annotations

import pytest

from gelbridge._config import DefaultsConfig, ModelChoice
from gelbridge._mapping import choose_turn
from gelbridge._records import ConversationRecord, GenerationRequest, ModelRef, SettingsRecord
from testkit.mapping_builders import T, reply, user

GEN = ModelRef(provider="anthropic", id="gen")
PREV = ModelRef(provider="openai", id="prev")
CONVM = ModelRef(provider="google", id="conv")
SETM = ModelRef(provider="openrouter", id="settings")
DEFAULTS = DefaultsConfig(model=ModelChoice(provider="cocore", id="default"), tools=["d"], effort="high")


def make(level: int):
    """Records where only levels >= ``level`` have values (0 = generation ... 4 = default)."""
    gen = GenerationRequest(model=GEN, tools=["g"], effort="low") if level <= 0 else GenerationRequest()
    msg = user("a.r0", generation=gen)
    prev = reply("a", model=PREV) if level <= 1 else reply("a")
    conv = (ConversationRecord(created_at=T, model=CONVM, tools=["c"]) if level <= 2
            else ConversationRecord(created_at=T))
    sett = (SettingsRecord(model=SETM, tools=["s"], effort="medium") if level <= 3 else SettingsRecord())
    return msg, prev, conv, sett


@pytest.mark.parametrize(
    "level, model, model_src, tools, tools_src, effort, effort_src",
    [
        (0, GEN, "generation", ["g"], "generation", "low", "generation"),
        (1, PREV, "previous_reply", ["c"], "conversation", "medium", "settings"),
        (2, CONVM, "conversation", ["c"], "conversation", "medium", "settings"),
        (3, SETM, "settings", ["s"], "settings", "medium", "settings"),
        (4, ModelRef(provider="cocore", id="default"), "default", ["d"], "default", "high", "default"),
    ],
)
def test_fallback_table(level, model, model_src, tools, tools_src, effort, effort_src) -> None:
    msg, prev, conv, sett = make(level)
    c = choose_turn(msg, previous_reply=prev, conversation=conv, settings_record=sett, defaults=DEFAULTS)
    assert (c.model, c.tools, c.effort) == (model, tools, effort)
    assert c.sources == {"model": model_src, "tools": tools_src, "effort": effort_src}


def test_nothing_anywhere() -> None:
    c = choose_turn(user(None))
    assert c.model is None and c.tools == [] and c.effort is None
    assert c.sources == {"model": "none", "tools": "default", "effort": "none"}


def test_previous_reply_effort_is_not_a_fallback() -> None:
    c = choose_turn(user("a.r0"), previous_reply=reply("a", effort="max"))
    assert c.effort is None


def test_empty_tool_list_is_an_answer_not_a_gap() -> None:
    msg = user(None, generation=GenerationRequest(tools=[]))
    c = choose_turn(msg, settings_record=SettingsRecord(tools=["s"]), defaults=DEFAULTS)
    assert c.tools == [] and c.sources["tools"] == "generation"


def test_tool_names_are_deduplicated_in_order() -> None:
    msg = user(None, generation=GenerationRequest(tools=["b", "a", "b"]))
    assert choose_turn(msg).tools == ["b", "a"]


def test_settings_tools_skip_conversation_without_tools() -> None:
    c = choose_turn(user(None), conversation=ConversationRecord(created_at=T, model=CONVM),
                    settings_record=SettingsRecord(tools=["s"]))
    assert c.tools == ["s"] and c.model == CONVM
