"""``gelbridge convert`` on the example conversation and on approval/error cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._records import (
    AtUri,
    GenerationRequest,
    MessageRecord,
    PlainContent,
    SettingsRecord,
)
from gelbridge._sealing import Keyring, seal_content
from testkit.mapping_builders import CONV, T, approve, assert_valid_request, call, check_tool_pairs, messages, text

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"
runner = CliRunner()
DID = "did:plc:examplegelbridgedemo2345"


def invoke(*args: str):
    return runner.invoke(app, ["convert", *args])


def test_convert_the_example_conversation() -> None:
    r = invoke("--keyring", str(EXAMPLE / "keyring.json"), "--message", "3mbd36vbls22b",
               str(EXAMPLE / "records.json"))
    assert r.exit_code == 0, r.output
    wire = json.loads(r.stdout)
    assert_valid_request(wire)
    assert wire["model"] == "gpt-4o-mini"  # previous reply's model
    assert wire["reasoning"] == {"enabled": True, "effort": "low"}  # generation.effort
    assert wire["instructions"][0]["text"].startswith("You are a concise assistant")
    ms = [i["message"] for i in wire["conversation"]]
    assert [m["role"] for m in ms] == ["user", "assistant", "user"]
    assert [c["type"] for c in ms[1]["content"]] == ["thinking", "text"]
    assert ms[2]["content"][0]["text"] == "And roughly how many people live there?"


def test_unknown_message_and_missing_keyring_fail_with_one_line(tmp_path: Path) -> None:
    r = runner.invoke(app, ["convert", "--keyring", str(EXAMPLE / "keyring.json"), "--message", "nope",
                            str(EXAMPLE / "records.json")])
    assert r.exit_code != 0 and "message nope is not in" in str(r.exception)


def test_an_error_quoting_what_was_asked_is_shown_on_one_line_never_obeyed() -> None:
    import subprocess
    import sys

    key = "3mbd\x1b]0;owned\x07\x1b[2J\u202e"  # an error line quotes it (main() prints it)
    p = subprocess.run([sys.executable, "-m", "gelbridge", "convert", "--keyring", str(EXAMPLE / "keyring.json"),
                        "--message", key, str(EXAMPLE / "records.json")], capture_output=True, timeout=60)
    assert p.returncode == 1 and p.stdout == b""
    assert not [raw for raw in (b"\x1b", b"\x07", "\u202e".encode()) if raw in p.stderr]
    assert p.stderr.decode().startswith("error: message 3mbd␛]0;owned␇␛[2J<U+202E> is not in ")


def write_file(tmp_path: Path, ring: Keyring, records: list[tuple[str, str, object, list]]) -> Path:
    out = []
    for coll, rkey, rec, parts in records:
        uri = AtUri(DID, coll, rkey)
        value = rec.to_value()
        if parts is not None:
            value["content"] = seal_content(PlainContent(parts=parts), uri=uri, key_id="k", keyring=ring).to_value()
        out.append({"uri": str(uri), "value": value})
    p = tmp_path / "records.json"
    p.write_text(json.dumps({"records": out}))
    return p


def test_convert_resolves_approvals_and_reports_what_it_cannot_do(tmp_path: Path) -> None:
    ring = Keyring()
    ring.add_new("k")
    ring.save(tmp_path / "ring.json")
    msg = "chat.gel.assistant.message"
    plain = {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}
    u0 = MessageRecord(conversation=CONV, role="user", content=plain, generation=GenerationRequest(), created_at=T)
    r0 = MessageRecord(conversation=CONV, role="assistant", parent="a", content=plain, status="awaitingApproval",
                       created_at=T)
    u1 = MessageRecord(conversation=CONV, role="user", parent="a.r0", content=plain,
                       generation=GenerationRequest(tools=["current_time", "mcp_x_y"]), created_at=T)
    path = write_file(tmp_path, ring, [
        (msg, "a", u0, [text("q")]),
        (msg, "a.r0", r0, [call("w1", "fetch_url", approval="pending"), call("w2", "fetch_url", approval="pending")]),
        (msg, "b", u1, [approve("w1"), approve("w2", False, "no")]),
        ("chat.gel.assistant.settings", "self",
         SettingsRecord(model={"provider": "openai", "id": "gpt-x"}), None),
    ])
    r = runner.invoke(app, ["convert", "--keyring", str(tmp_path / "ring.json"), "--message", "b", str(path)])
    assert r.exit_code == 0, r.output
    wire = json.loads(r.stdout)
    assert_valid_request(wire)
    check_tool_pairs(wire)
    assert wire["model"] == "gpt-x" and [t["name"] for t in wire["tools"]] == ["current_time"]
    err = r.stderr.splitlines()
    assert any(line.startswith("tools.mcp_x_y: unsupported") for line in err)
    # the worker's turn: the approved call is repeated with the result offline gives it
    # (tools are not run offline), the denied one with the denial
    results = {c["tool_result"]["tool_use_id"]: c["tool_result"] for i in wire["conversation"]
               for c in i["message"]["content"] if c["type"] == "tool_result"}
    assert set(results) == {"w1", "w2"}
    assert "not run offline" in json.dumps(results["w1"]) and results["w2"]["is_error"] is True


def test_convert_without_any_model_says_how_to_set_one(tmp_path: Path) -> None:
    ring = Keyring()
    ring.add_new("k")
    ring.save(tmp_path / "ring.json")
    plain = {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}
    u0 = MessageRecord(conversation=CONV, role="user", content=plain, generation=GenerationRequest(), created_at=T)
    path = write_file(tmp_path, ring, [("chat.gel.assistant.message", "a", u0, [text("q")])])
    r = runner.invoke(app, ["convert", "--keyring", str(tmp_path / "ring.json"), "--message", "a", str(path)])
    assert r.exit_code != 0 and "[defaults] model" in str(r.exception)


@pytest.mark.timeout(120)  # it took hours before load_thread was linear (scripts/bench_thread.py)
def test_convert_a_9999_record_chain_with_a_raised_depth_limit(tmp_path: Path) -> None:
    """The chain of issue 23: 9,999 sealed messages, ``[thread] max_depth = 30000``."""
    ring = Keyring()
    ring.add_new("k")
    ring.save(tmp_path / "ring.json")
    msg = "chat.gel.assistant.message"
    plain = {"$type": "chat.gel.assistant.defs#plainContent", "parts": []}
    records: list[tuple[str, str, object, list]] = []
    parent = None
    for i in range(9_999):
        if i % 2 == 0:
            rkey = f"3m{i:011d}"
            rec = MessageRecord(conversation=CONV, role="user", parent=parent, content=plain,
                                generation=GenerationRequest(), created_at=T)
        else:
            rkey = f"{parent}.r0"
            rec = MessageRecord(conversation=CONV, role="assistant", parent=parent, content=plain,
                                status="complete", created_at=T)
        records.append((msg, rkey, rec, [text(f"m{i}")]))
        parent = rkey
    path = write_file(tmp_path, ring, records)
    (tmp_path / "c.toml").write_text('[thread]\nmax_depth = 30000\n\n[defaults]\nmodel = { provider = "openai", id = "m" }\n')
    r = runner.invoke(app, ["convert", "--keyring", str(tmp_path / "ring.json"), "--config", str(tmp_path / "c.toml"),
                            "--message", str(parent), str(path)])
    assert r.exit_code == 0, r.output[-2000:]
    ms = messages(json.loads(r.stdout))
    assert len(ms) == 9_999 and ms[0]["content"][0]["text"] == "m0" and ms[-1]["content"][0]["text"] == "m9998"
