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


HOSTILE_TOOL = "clock\x1b]0;owned\x07\x1b[2J"
HOSTILE_MODEL = "gpt\x1b]0;owned\x07\x9b2J\u202eid"


def hostile_records(tmp_path: Path) -> Path:
    """The example, its last message asking for a model whose id is written to drive a
    terminal (anyone who can write the account's records chooses it)."""
    doc = json.loads(RECORDS.read_text())
    doc["records"][-1]["value"]["generation"]["model"] = {"provider": "openai", "id": HOSTILE_MODEL}
    path = tmp_path / "records.json"
    path.write_text(json.dumps(doc))
    return path


def test_reply_answers_a_call_to_an_invalid_tool_name_and_asks_the_model_again(
        config: tuple[Path, ModelServer], tmp_path: Path) -> None:
    cfg, srv = config
    key, did = last_user_key()
    srv.enqueue(Turn(text="", tool_calls=[ToolCall(HOSTILE_TOOL, {}, id="c1")]), Turn(text="No such tool, sorry."))
    res = run("reply", "--keyring", str(KEYRING), "--config", str(cfg), "--message", key,
              str(hostile_records(tmp_path)))
    assert res.exit_code == 0, res.output
    rec = MessageRecord.from_value(json.loads(res.stdout))
    plain = open_content(rec.content, uri=f"at://{did}/chat.gel.assistant.message/{key}.r0",
                         keyring=Keyring.load(KEYRING))
    call, result, answer = plain.parts
    # never left waiting for approval: answered as an unknown tool, the model told why
    assert rec.status == "complete" and call.approval is None and call.tool == "invalid_tool_name"
    assert result.is_error and "not a valid tool name" in result.output and answer.text == "No such tool, sorry."
    second = srv.requests[1].body["messages"]
    assert any("not a valid tool name" in str(m.get("content")) for m in second if m["role"] == "tool")
    assert HOSTILE_TOOL not in json.dumps(second)
    # the model id on stderr (and in the record on stdout) is shown, never obeyed
    assert rec.model.id == HOSTILE_MODEL
    for raw in (b"\x1b", b"\x07", "\x9b".encode(), "\u202e".encode()):
        assert raw not in res.stdout_bytes and raw not in res.stderr_bytes
    assert "model: openai/gpt␛]0;owned␇<U+009B>2J<U+202E>id (adapter openai_md)" in res.stderr
    assert "gpt\\u001b]0;owned\\u0007\\u009b2J\\u202eid" in res.stdout
