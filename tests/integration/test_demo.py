"""`gelbridge demo` runs the whole path on this machine and prints the opened conversation."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gelbridge._dev.demo import run_demo

pytestmark = [pytest.mark.pds, pytest.mark.timeout(400)]


def test_demo_prints_opened_conversation_and_timings_and_keeps_state(tmp_path: Path) -> None:
    out = io.StringIO()
    run_demo(text="hello demo", timeout=60, keep_dir=tmp_path / "demo", out=out)
    text = out.getvalue()
    assert "  user       hello demo" in text
    assert "  assistant  You said: hello demo" in text
    assert "[complete, local/echo-1, finish stop]" in text
    assert "reply complete" in text and "turn: queue" in text
    assert (tmp_path / "demo" / "gelbridge.toml").is_file()
    assert (tmp_path / "demo" / "state" / "gelbridge.db").is_file()

    from typer.testing import CliRunner

    from gelbridge._cli import app

    res = CliRunner().invoke(app, ["status", "--config", str(tmp_path / "demo" / "gelbridge.toml")])
    assert res.exit_code == 0, res.output
    assert "in flight 0" in res.output and "recent turns (1)" in res.output
    assert ".r0" in res.output and "complete" in res.output
    assert "hello demo" not in res.output


def test_demo_chat_goes_on_in_the_same_conversation_until_the_input_ends() -> None:
    out = io.StringIO()
    typed = iter(["and a second one", "/regen"])

    async def read_line(prompt: str) -> str | None:
        out.write(prompt)
        return next(typed, None)  # then the end of input

    run_demo(text="first", timeout=60, out=out, read_line=read_line)
    text = out.getvalue()
    assert "  assistant  You said: first" in text
    assert "the chat goes on in the same conversation" in text
    assert "bot> You said: and a second one\n[complete, local/echo-1]" in text
    assert "bot> You said: and a second one\n[complete, local/echo-1, attempt 1]" in text
