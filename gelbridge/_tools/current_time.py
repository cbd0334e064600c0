"""Built-in ``current_time``: the date and time now, in UTC and optionally an IANA zone."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gelbridge._tools.config import CurrentTimeConfig
from gelbridge._tools.registry import Tool, ToolOutput

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "timezone": {
            "type": "string",
            "description": "Optional IANA time zone name such as 'Europe/Berlin' or 'America/New_York'.",
        }
    },
    "additionalProperties": False,
}


def describe_time(now_utc: datetime, zone: str | None) -> ToolOutput:
    """Pure: the answer for a given instant."""
    result: dict[str, Any] = {"utc": now_utc.astimezone(UTC).isoformat(timespec="seconds")}
    if zone:
        try:
            tz = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            return ToolOutput(f"Unknown time zone {zone!r}: use an IANA name such as 'Europe/Berlin'.", True)
        local = now_utc.astimezone(tz)
        result.update(
            timezone=zone,
            local=local.isoformat(timespec="seconds"),
            weekday=local.strftime("%A"),
            utc_offset=local.strftime("%z"),
        )
    else:
        result["weekday"] = now_utc.astimezone(UTC).strftime("%A")
    return ToolOutput(json.dumps(result))


def make_current_time(
    config: CurrentTimeConfig, *, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> Tool:
    async def run(args: dict[str, Any]) -> ToolOutput:
        return describe_time(clock(), args.get("timezone"))

    return Tool(
        name="current_time",
        description="Get the current date and time (UTC, and local time for an optional IANA time zone).",
        parameters=PARAMETERS,
        executor=run,
        approval=config.approval,
    )
