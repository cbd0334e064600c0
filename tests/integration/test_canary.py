"""Nothing derived from sealed content leaves the ciphertext (issue: isolation).

One canary string is sealed into every kind of content a conversation holds (message
text, an unknown part's ``$type`` and fields, a file's name and mime type, conversation
instructions, approval reasons, content that does not follow the lexicon), and the model
and tools echo it back everywhere they can (text, reasoning, a provider call id, tool
inputs and outputs, a tool name it made up, provider error bodies, a mid-stream error).
Then every place outside ciphertext is searched for it: every log line of every logger
at DEBUG (tracebacks included), every state file, every unsealed field of every record
in the repo, and the default output of the offline CLI (``convert``, ``convert --to``,
``reply``) on the same records.

Key grants (PROTOCOL.md §6): with a bridge key and a granted conversation key, neither
that key nor the bridge's private key (raw, base64 std or urlsafe, padded or not, hex)
is in any log line, any file under the state dir, ``gelbridge status`` or /metrics.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import Fail, MidStreamError, ModelServer, ToolCall, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._observability import JsonFormatter
from gelbridge._records import (
    CONVERSATION_COLLECTION,
    MESSAGE_COLLECTION,
    AtUri,
    PlainContent,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    new_tid,
    now_datetime,
)
from gelbridge._sealing import Keyring, seal_blob, seal_content, seal_value

from .conftest import App, http_of, make_settings, running_worker, text_of
from .test_tools_approval import WAIT, mcp_servers

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]

CANARY = "cnryq7x9zkw4"  # lower case and alphanumeric: fits NSIDs, ids, tool names, mime types
TEXT_PART = "chat.gel.assistant.defs#textPart"
PLAIN = "chat.gel.assistant.defs#plainContent"


def hits(text: str) -> bool:
    return CANARY in text.lower()


def unsealed(value: Any) -> Any:
    """A record value without its ciphertext and nonce (all the rest is in the clear)."""
    if isinstance(value, dict):
        return {k: unsealed(v) for k, v in value.items() if k not in ("ciphertext", "nonce")}
    if isinstance(value, list):
        return [unsealed(v) for v in value]
    return value


async def seal_raw(app: App, rkey: str, plaintext: dict[str, Any]) -> dict[str, Any]:
    return seal_value(plaintext, uri=app.uri(rkey), key_id=app.key_id, keyring=app.keyring).to_value()


async def send_raw(app: App, conv: str, plaintext: dict[str, Any], parent: str | None = None) -> str:
    k = new_tid()
    value: dict[str, Any] = {"$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user",
                             "generation": {"attempt": 0}, "createdAt": now_datetime(),
                             "content": await seal_raw(app, k, plaintext)}
    if parent is not None:
        value["parent"] = parent
    await app.pds.put_record(MESSAGE_COLLECTION, k, value)
    return k


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    return subprocess.run([sys.executable, "-m", "gelbridge", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


async def test_a_canary_in_every_kind_of_content_appears_nowhere_outside_ciphertext(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    c = CANARY
    count_file, gate_file = tmp_path / "executions.log", tmp_path / "gate"
    state = tmp_path / "state"
    settings = make_settings(
        dev_pds.pds_url, pds_account, state, model_server.url,
        defaults={"model": {"provider": "local", "id": "echo-1"}, "tools": ["mcp_j_lookup", "mcp_j_note"]},
        tools={"call_timeout": 60}, mcp=mcp_servers(count_file, gate_file),
    )
    conv = new_tid()
    # conversation instructions: a canary text and an unknown part
    await app.pds.put_record(CONVERSATION_COLLECTION, conv, {
        "$type": CONVERSATION_COLLECTION, "createdAt": now_datetime(),
        "instructions": seal_value({"$type": PLAIN, "parts": [
            {"$type": TEXT_PART, "text": f"be {c}"}, {"$type": f"com.{c}.part#x", c: c}]},
            uri=AtUri(app.did, CONVERSATION_COLLECTION, conv), key_id=app.key_id, keyring=app.keyring).to_value()})
    blob = await app.pds.upload_blob(seal_blob(f"file {c}".encode(), key_id=app.key_id, keyring=app.keyring))
    asked: list[str] = []
    worker_ring = Keyring({keyring[1]: keyring[0][keyring[1]]})  # the app gets a key of its own later
    async with running_worker(settings, pds_account, worker_ring) as worker:
        # 1. text, an unknown part, a file with a canary name and mime type; the model
        #    answers with canary text and reasoning, an auto-run call with canary input
        #    and id, and a call to a tool it made up (not offered: it waits for approval)
        model_server.enqueue(Turn(text=f"answer {c}", reasoning=f"think {c}", tool_calls=[
            ToolCall("mcp_j_lookup", {"text": c}, id=f"{c}-call"),
            ToolCall(f"{c}_tool", {"x": c}, id=f"{c}-made-up")]))
        k1 = await send_raw(app, conv, {"$type": PLAIN, "parts": [
            {"$type": TEXT_PART, "text": f"hello {c}"},
            {"$type": f"com.{c}.part#x", "value": c},
            {"$type": "chat.gel.assistant.defs#filePart", "name": f"{c}.txt",
             "file": {**blob, "mimeType": f"text/x-{c}"}},
        ]})
        asked.append(k1)
        await app.wait_status(f"{k1}.r0", "awaitingApproval", timeout=WAIT)
        # 2. the user approves the made-up tool with a canary reason: it is run and fails
        #    (not offered); then the provider fails with a canary in its error body
        model_server.enqueue(Fail(500, f"provider error {c}"))
        k2 = await send_raw(app, conv, {"$type": PLAIN, "parts": [
            {"$type": "chat.gel.assistant.defs#toolApprovalPart", "callId": f"{c}-made-up", "approved": True,
             "reason": f"ok {c}"}]}, parent=f"{k1}.r0")
        asked.append(k2)
        await app.wait_status(f"{k2}.r0", "error", timeout=WAIT)
        # 3. a mid-stream error with a canary message after canary text
        model_server.enqueue(MidStreamError(after_chunks=1, message=f"mid {c}", turn=Turn(text=f"partial {c} " * 4)))
        k3 = await send_raw(app, conv, {"$type": PLAIN, "parts": [{"$type": TEXT_PART, "text": f"more {c}"}]},
                            parent=f"{k1}.r0")
        asked.append(k3)
        await app.wait_status(f"{k3}.r0", "error", timeout=WAIT)
        # 4. sealed content that does not follow the lexicon (canary values and key)
        k4 = await send_raw(app, conv, {"$type": PLAIN, "parts": [
            {"$type": TEXT_PART, "text": 7, c: f"x {c}"}, {"$type": TEXT_PART, "text": c}]})
        await app.wait_status(f"{k4}.r0", "error", timeout=WAIT)
        # 5. a forged waiting reply with a canary call, approved
        kf = new_tid()
        await app.pds.put_record(MESSAGE_COLLECTION, kf, {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "user", "createdAt": now_datetime(),
            "content": await seal_raw(app, kf, {"$type": PLAIN, "parts": [{"$type": TEXT_PART, "text": c}]})})
        forged = ToolCallPart(call_id=f"{c}-forged", tool="mcp_j_note", input=json.dumps({"text": c}),
                              approval="pending")
        await app.pds.put_record(MESSAGE_COLLECTION, f"{kf}.r0", {
            "$type": MESSAGE_COLLECTION, "conversation": conv, "role": "assistant", "parent": kf,
            "status": "awaitingApproval", "createdAt": now_datetime(),
            "content": seal_content(PlainContent(parts=[forged]), uri=app.uri(f"{kf}.r0"), key_id=app.key_id,
                                    keyring=app.keyring).to_value()})
        model_server.enqueue(Turn(text=f"fine {c}"))
        k5 = await app.send(None, conversation=conv, parent=f"{kf}.r0", parts=[
            ToolApprovalPart(call_id=f"{c}-forged", approved=True, reason=c), TextPart(text=c)])
        await app.wait_status(f"{k5}.r0", "complete", timeout=WAIT)
        # 6. a message sealed with a key gelbridge does not have
        app.keyring.add_new("k-app-only")  # keyIds are unsealed by design
        k6 = await app.send(f"secret {c}", conversation=conv, key_id="k-app-only")
        await app.wait_status(f"{k6}.r0", "error", timeout=WAIT)
        await worker.wait_idle(10)
        repo = await app.pds.get_repo(app.did)

    assert not count_file.exists() or "forged" not in count_file.read_text()
    # the provider failures are named in the operator's log by their cause (never their body)
    lines = [r.getMessage() for r in caplog.records]
    assert (f"reply {k2}.r0 failed: server_error (ProviderError: provider 'local': HTTP 500 from "
            f"127.0.0.1:{model_server.port} (server_error))") in lines
    assert any(ln.startswith(f"reply {k3}.r0 failed: ") and "sent an error event mid-stream" in ln for ln in lines)
    # every log line, at every level, of every logger (tracebacks included)
    leaked = [r for r in caplog.records if hits(r.getMessage()) or hits(str(r.exc_text or ""))]
    assert not leaked, [f"{r.name}: {r.getMessage()[:200]}" for r in leaked]
    assert not hits(caplog.text)
    # the same records as JSON lines (--log-format json): one object each, no canary
    fmt = JsonFormatter()
    for r in caplog.records:
        line = fmt.format(r)
        assert "\n" not in line and isinstance(json.loads(line), dict) and not hits(line)
    # every state file
    for f in state.iterdir():
        assert not hits(f.read_bytes().decode("latin-1")), f
    # every unsealed field of every record
    for collection in (MESSAGE_COLLECTION, CONVERSATION_COLLECTION):
        async for r in app.pds.iter_records(collection):
            assert not hits(json.dumps(unsealed(r.value), default=str)), (r.rkey, unsealed(r.value))
    # the offline CLI's default output on the same records
    (tmp_path / "repo.car").write_bytes(repo)
    ring = tmp_path / "ring.json"
    worker_ring.save(ring)
    cfg = tmp_path / "cli.toml"
    cfg.write_text(f'[defaults]\nmodel = {{ provider = "local", id = "echo-1" }}\n'
                   f'[providers.local]\nadapter = "openai"\nbase_url = "{model_server.url}/v1"\nmax_retries = 0\n')
    for k in (k1, k2, k3, k4, k5):
        base = ["--keyring", str(ring), "--config", str(cfg), "--message", k, "repo.car"]
        conv_out = run_cli("convert", *base, cwd=tmp_path)
        assert not hits(conv_out.stderr), (k, conv_out.stderr)
        to_out = run_cli("convert", *base, "--to", "openai", cwd=tmp_path)
        assert not hits(to_out.stderr), (k, to_out.stderr)
    model_server.enqueue(Fail(500, f"provider error {c}"), Turn(text=f"offline {c}", reasoning=c))
    for k in (k3, k1):
        out = run_cli("reply", "--keyring", str(ring), "--config", str(cfg), "--message", k, "repo.car",
                      cwd=tmp_path)
        assert not hits(out.stderr), (k, out.stderr)
        if out.stdout.strip():
            assert not hits(json.dumps(unsealed(json.loads(out.stdout)))), out.stdout
    # and the content really was there to leak: the CLI shows it when asked to
    shown = run_cli("convert", "--keyring", str(ring), "--config", str(cfg), "--message", k1, "repo.car",
                    "--show-content", cwd=tmp_path)
    assert hits(shown.stderr) and hits(shown.stdout)


def forms(raw: bytes) -> list[bytes]:
    """Every way a key could be written out: raw, base64 (std and urlsafe, padded and
    not) and hex (either case)."""
    std, url = base64.b64encode(raw), base64.urlsafe_b64encode(raw)
    return [raw, std, std.rstrip(b"="), url, url.rstrip(b"="), raw.hex().encode(), raw.hex().upper().encode()]


def key_leaks(blob: bytes | str, keys: dict[str, bytes]) -> list[str]:
    data = blob.encode("utf-8", "surrogateescape") if isinstance(blob, str) else blob
    return [f"{name} ({i})" for name, raw in keys.items() for i, f in enumerate(forms(raw)) if f in data]


async def test_neither_a_granted_key_nor_the_bridge_key_appears_in_logs_state_status_or_metrics(
    dev_pds: DevPds, pds_account: AccountInfo, app: App, model_server: ModelServer, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    from gelbridge._grants import BridgeKey
    from gelbridge._records import KEY_GRANT_COLLECTION
    from gelbridge._state import DB_FILENAME

    from .test_key_grants import app_keyring, ask, seen, write_grant

    caplog.set_level(logging.DEBUG)
    bridge = BridgeKey.generate(kid="b-canary", name="canary bridge")
    key_file = tmp_path / "keys" / "bridge.json"
    bridge.save(key_file)
    granted, refused = os.urandom(32), os.urandom(32)
    secret = {"bridge private key": bridge.private_key.private_bytes_raw(), "granted key": granted,
              "key of a tampered grant": refused}
    assert "bridge private key (1)" in key_leaks(key_file.read_bytes(), secret)  # the search finds it where it is
    state = tmp_path / "state"
    settings = make_settings(dev_pds.pds_url, pds_account, state, model_server.url,
                             keyring={"bridge_key": [str(key_file)]}, observability={"listen": "127.0.0.1:0"})
    async with running_worker(settings, pds_account, Keyring()) as worker:
        good = await write_grant(app, bridge, "k-canary", granted)
        bad = await write_grant(app, bridge, "k-refused", refused, tamper=60)
        assert (await seen(worker, good)).honoured and (await seen(worker, bad)).code == "sealed_key"
        app.keyring = app_keyring(("k-canary", granted), ("k-refused", refused))
        rec, content = await ask(app, "granted canary", "k-canary")
        assert rec.status == "complete" and text_of(content) == "You said: granted canary"
        rec, _ = await ask(app, "refused canary", "k-refused")
        assert rec.error is not None and rec.error.kind == "decrypt_failed"
        await app.pds.delete_record(KEY_GRANT_COLLECTION, good)
        await seen(worker, good, gone=True)
        await worker.wait_idle(10)
        host, port = http_of(worker).sockets[0].getsockname()[:2]
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as http:
            metrics = (await http.get("/metrics")).text
        assert "gelbridge_key_grants" in metrics
        startup = "\n".join(worker.startup_lines("firehose"))
    # every log line, at every level (tracebacks and the JSON form included), the start-up lines
    fmt = JsonFormatter()
    for r in caplog.records:
        assert not key_leaks(r.getMessage() + str(r.exc_text or "") + fmt.format(r), secret), r.getMessage()
    assert not key_leaks(caplog.text, secret) and not key_leaks(startup, secret)
    assert any(f"key grant {bad} ignored" in r.getMessage() for r in caplog.records)  # it was logged, keyless
    # /metrics
    assert not key_leaks(metrics, secret)
    # every file under the state dir (the SQLite db, its WAL, anything else)
    files = [f for f in state.rglob("*") if f.is_file()]
    assert state / DB_FILENAME in files, files
    for f in files:
        assert not key_leaks(f.read_bytes(), secret), f
    # `gelbridge status`, text and JSON
    cfg = tmp_path / "status.toml"
    cfg.write_text(f'[account]\npds = "{dev_pds.pds_url}"\nidentifier = "{pds_account.handle}"\n'
                   f'[keyring]\nbridge_key = "{key_file}"\n[state]\ndir = "{state}"\n')
    for extra in ([], ["--json"]):
        out = run_cli("status", "--config", str(cfg), *extra, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert not key_leaks(out.stdout + out.stderr, secret), extra
    rep = json.loads(run_cli("status", "--config", str(cfg), "--json", cwd=tmp_path).stdout)
    assert (rep["accounts"][0]["grants"]["honoured"], rep["accounts"][0]["grants"]["ignored"]) == (0, 1)
