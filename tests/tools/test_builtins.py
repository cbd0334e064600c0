"""Built-in tool configuration and current_time."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gelbridge._config import Settings
from gelbridge._errors import ConfigError
from gelbridge._tools import ToolCall, builtin_tools, execute_calls, load_tool_registry
from gelbridge._tools.config import CurrentTimeConfig
from gelbridge._tools.current_time import describe_time, make_current_time

NOON = datetime(2026, 7, 1, 12, 0, 0, tzinfo=UTC)


def test_current_time_in_utc_and_a_zone() -> None:
    utc = json.loads(describe_time(NOON, None).text)
    assert utc == {"utc": "2026-07-01T12:00:00+00:00", "weekday": "Wednesday"}
    berlin = json.loads(describe_time(NOON, "Europe/Berlin").text)
    assert berlin["local"] == "2026-07-01T14:00:00+02:00" and berlin["utc_offset"] == "+0200"
    bad = describe_time(NOON, "Mars/Olympus_Mons")
    assert bad.is_error and "IANA" in bad.text


async def test_current_time_through_the_executor() -> None:
    from gelbridge._tools import ToolRegistry

    reg = ToolRegistry([make_current_time(CurrentTimeConfig(), clock=lambda: NOON)])
    (ok, extra) = await execute_calls(
        [ToolCall("a", "current_time", '{"timezone": "Asia/Tokyo"}'), ToolCall("b", "current_time", '{"tz": "x"}')],
        reg, timeout=5, max_output_chars=1000,
    )
    assert json.loads(ok.output)["local"] == "2026-07-01T21:00:00+09:00"
    assert extra.is_error and "Unknown argument(s): tz" in extra.output


def test_unknown_tool_tables_and_bad_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"\[tools.web_browse\]"):
        builtin_tools({"web_browse": {"enabled": True}})
    # web_search is the provider's own: configured here, never a tool gelbridge runs
    assert [t.name for t in builtin_tools({"web_search": {"max_uses": 2}})] == ["current_time", "fetch_url"]
    with pytest.raises(ConfigError, match=r"\[tools.fetch_url\] approval"):
        builtin_tools({"fetch_url": {"approval": "maybe"}})
    with pytest.raises(ConfigError, match=r"\[tools.current_time\] colour"):
        builtin_tools({"current_time": {"colour": "blue"}})


async def test_registry_without_mcp_has_the_builtins_and_flat_keys_are_not_tools() -> None:
    s = Settings.model_validate({"tools": {"max_steps": 4, "call_timeout": 5, "fetch_url": {"allow_hosts": ["127.0.0.1"]}}})
    reg = await load_tool_registry(s)
    assert reg.names() == ["current_time", "fetch_url"]
    assert s.tools_settings.max_steps == 4
    await reg.aclose()
