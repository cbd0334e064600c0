"""'gelbridge convert --to' and 'gelbridge reply' on examples/conversation against a ModelServer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._dev.model_server import ModelServer, ToolCall, Turn
from gelbridge._records import MessageRecord, PlainContent
from gelbridge._sealing import Keyring, open_content
from testkit.adapter_helpers import SCRIPTS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"
RECORDS = EXAMPLE / "records.json"
KEYRING = EXAMPLE / "keyring.json"


def last_user_key() -> tuple[str, str]:
    doc = json.loads(RECORDS.read_text())
    users = [r for r in doc["records"] if r["value"].get("role") == "user"]
    uri = users[-1]["uri"]
    return uri.rsplit("/", 1)[1], uri.split("/")[2]


@pytest.fixture
def config(tmp_path: Path) -> tuple[Path, ModelServer]:
    srv = ModelServer(api_key="sk-cli").start()
    cfg = tmp_path / "gelbridge.toml"
    cfg.write_text(f"""
[providers.openai]
adapter = "openai_md"
base_url = "{srv.url}"
api_key_env = "CLI_TEST_KEY"

[adapters]
dirs = ["{SCRIPTS}"]
""")
    yield cfg, srv
    srv.stop()


def run(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env={"CLI_TEST_KEY": "sk-cli"})


def test_convert_to_prints_the_provider_body_without_network(config: tuple[Path, ModelServer]) -> None:
    cfg, srv = config
    key, _ = last_user_key()
    res = run("convert", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key, "--to", "openai_md",
              str(RECORDS))
    assert res.exit_code == 0, res.output
    body = json.loads(res.stdout)
    assert body["model"] == "gpt-4o-mini" and body["stream"] is True
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert "disable_thinking" not in body  # the script removed it
    assert srv.requests == []


def test_convert_to_unknown_adapter_is_a_clear_error(config: tuple[Path, ModelServer]) -> None:
    cfg, _ = config
    key, _ = last_user_key()
    res = run("convert", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key, "--to", "nope",
              str(RECORDS))
    assert res.exit_code != 0 and "nope" in str(res.exception)


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_reply_prints_the_sealed_record(config: tuple[Path, ModelServer], stream: str) -> None:
    cfg, srv = config
    key, did = last_user_key()
    srv.enqueue(Turn(text="About 460,000 people.", usage=(40, 9, 0)))
    res = run("reply", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key, stream, str(RECORDS))
    assert res.exit_code == 0, res.output
    value = json.loads(res.stdout)
    rec = MessageRecord.from_value(value)
    assert value["$type"] == "chat.gel.assistant.message"
    assert (rec.role, rec.parent, rec.status, rec.finish_reason) == ("assistant", key, "complete", "stop")
    assert rec.model.provider == "openai" and rec.model.id == "gpt-4o-mini" and rec.effort == "low"
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == (40, 9)
    assert rec.created_at and rec.updated_at
    plain = open_content(rec.content, uri=f"at://{did}/chat.gel.assistant.message/{key}.r0",
                         keyring=Keyring.load(KEYRING))
    assert isinstance(plain, PlainContent)
    assert [p.text for p in plain.parts] == ["About 460,000 people."]
    assert "About 460,000" not in res.stderr and "input 40" in res.stderr and "timing:" in res.stderr


def test_reply_runs_no_tools_offline(config: tuple[Path, ModelServer]) -> None:
    cfg, srv = config
    key, did = last_user_key()
    srv.enqueue(Turn(text="", tool_calls=[ToolCall("clock", {}, id="c1")]))
    res = run("reply", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key, str(RECORDS))
    assert res.exit_code == 0, res.output
    rec = MessageRecord.from_value(json.loads(res.stdout))
    plain = open_content(rec.content, uri=f"at://{did}/chat.gel.assistant.message/{key}.r0",
                         keyring=Keyring.load(KEYRING))
    kinds = [type(p).__name__ for p in plain.parts]
    # an unknown tool needs approval: written pending, reply awaits approval; nothing ran
    assert kinds == ["ToolCallPart"] and plain.parts[0].approval == "pending"
    assert rec.status == "awaitingApproval"


def test_reply_error_prints_the_error_record(config: tuple[Path, ModelServer]) -> None:
    from gelbridge._dev.model_server import Fail

    cfg, srv = config
    key, _ = last_user_key()
    srv.enqueue(Fail(400, "bad request: echoing What is the capital"))
    res = run("reply", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key, str(RECORDS))
    assert res.exit_code == 1
    value = json.loads(res.stdout)
    assert value["status"] == "error" and value["error"]["kind"] == "invalid_request"
    assert "capital" not in value["error"]["message"]  # a provider's text never reaches the record
