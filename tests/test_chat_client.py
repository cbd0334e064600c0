"""The chat app's view of a reply (``gelbridge chat`` / ``send``): its text as the parts
stream in."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._chat_client import Reply
from gelbridge._config import Settings
from gelbridge._errors import ConfigError, KeyringError
from gelbridge._records import PlainContent, TextPart
from gelbridge._records.models import MessageRecord, Part, ToolCallPart, ToolResultPart
from gelbridge._sealing import Keyring

RECORD = MessageRecord.from_value({
    "$type": "chat.gel.assistant.message", "conversation": "3mbd36vbls22b", "role": "assistant",
    "status": "complete", "createdAt": "2026-01-01T00:00:00.000Z",
    "content": PlainContent(parts=[TextPart(text="")]).to_value(),
})


def _text(*parts: Part) -> str:
    return Reply("3mbd36vbls22c.r0", RECORD, PlainContent(parts=list(parts))).text


def test_text_after_a_tool_call_starts_on_a_new_line_and_only_grows() -> None:
    call = ToolCallPart(call_id="c1", tool="current_time", input="{}", approval="approved")
    result = ToolResultPart(call_id="c1", output="12:00")
    steps = [
        (TextPart(text="Calling current_time."),),
        (TextPart(text="Calling current_time."), call, result),
        (TextPart(text="Calling current_time."), call, result, TextPart(text="It is noon.")),
    ]
    texts = [_text(*parts) for parts in steps]
    assert texts == ["Calling current_time.", "Calling current_time.", "Calling current_time.\nIt is noon."]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert _text(call, result, TextPart(text="Noon.")) == "Noon."  # no blank first line
    assert _text(TextPart(text="a"), TextPart(text="b")) == "ab"  # adjacent text stays as it was


def test_granting_needs_a_keyring_path_and_makes_the_file_on_first_use(tmp_path: Path) -> None:
    from gelbridge._chat_client import _add_key_to_file, _app_keyring

    bare = Settings.model_validate({"account": {"identifier": "alice.test"}})
    with pytest.raises(ConfigError, match=r"set \[keyring\] path"):
        _app_keyring(bare, {}, True)
    with pytest.raises(KeyringError):  # not granting: the keyring must exist and hold a key
        _app_keyring(bare, {}, False)
    path, ring = _app_keyring(bare, {"GELBRIDGE_KEYRING": str(tmp_path / "new" / "keys.json")}, True)
    assert path == tmp_path / "new" / "keys.json" and len(ring) == 0 and not path.exists()
    first, k1 = _add_key_to_file(path)
    second, k2 = _add_key_to_file(path)  # re-read: the first key is kept
    assert list(first) == [k1] and sorted(second) == sorted([k1, k2]) and Keyring.load(path) == second
