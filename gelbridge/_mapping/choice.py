"""Which model, tools and effort a reply uses (PROTOCOL.md §4.3), as one pure function.

Fallback order, first present value wins:

- model: ``generation.model`` → the previous reply's ``model`` (``K.r{n-1}`` for a
  regeneration, otherwise the parent reply; see ``thread.previous_reply_rkey``) →
  conversation ``model`` → settings ``model`` → operator ``[defaults] model``;
- tools: ``generation.tools`` → conversation ``tools`` → settings ``tools`` →
  operator ``[defaults] tools``;
- effort: ``generation.effort`` → settings ``effort`` → operator ``[defaults] effort``.

A tools list that is present but empty counts as present ("no tools"): leaving the
field out is how a record says "use the next level".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gelbridge._config import DefaultsConfig
from gelbridge._records.models import ConversationRecord, MessageRecord, ModelRef, SettingsRecord

Source = Literal["generation", "previous_reply", "conversation", "settings", "default", "none"]


@dataclass(frozen=True, slots=True)
class TurnChoice:
    """The model, tool names and effort for one reply, and where each came from."""

    model: ModelRef | None
    tools: list[str]
    effort: str | None
    sources: dict[str, Source] = field(default_factory=dict)


def _dedupe(names: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for n in names:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


def choose_turn(
    message: MessageRecord,
    *,
    previous_reply: MessageRecord | None = None,
    conversation: ConversationRecord | None = None,
    settings_record: SettingsRecord | None = None,
    defaults: DefaultsConfig | None = None,
) -> TurnChoice:
    """Apply the §4.3 fallbacks. ``previous_reply`` is the record at
    ``thread.previous_reply_rkey`` (None if it does not exist)."""
    gen = message.generation
    d = defaults if defaults is not None else DefaultsConfig()

    model: ModelRef | None = None
    msrc: Source = "none"
    if gen is not None and gen.model is not None:
        model, msrc = gen.model, "generation"
    elif previous_reply is not None and previous_reply.model is not None:
        model, msrc = previous_reply.model, "previous_reply"
    elif conversation is not None and conversation.model is not None:
        model, msrc = conversation.model, "conversation"
    elif settings_record is not None and settings_record.model is not None:
        model, msrc = settings_record.model, "settings"
    elif d.model is not None:
        model, msrc = ModelRef(provider=d.model.provider, id=d.model.id), "default"

    tools: list[str]
    tsrc: Source
    if gen is not None and gen.tools is not None:
        tools, tsrc = list(gen.tools), "generation"
    elif conversation is not None and conversation.tools is not None:
        tools, tsrc = list(conversation.tools), "conversation"
    elif settings_record is not None and settings_record.tools is not None:
        tools, tsrc = list(settings_record.tools), "settings"
    else:
        tools, tsrc = list(d.tools), "default"

    effort: str | None = None
    esrc: Source = "none"
    if gen is not None and gen.effort is not None:
        effort, esrc = gen.effort, "generation"
    elif settings_record is not None and settings_record.effort is not None:
        effort, esrc = settings_record.effort, "settings"
    elif d.effort is not None:
        effort, esrc = d.effort, "default"

    return TurnChoice(model, _dedupe(tools), effort, {"model": msrc, "tools": tsrc, "effort": esrc})
