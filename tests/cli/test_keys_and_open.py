"""CLI: ``gelbridge keys new`` and ``gelbridge open``."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from gelbridge._cli import app
from gelbridge._errors import KeyringError
from gelbridge._sealing import Keyring

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"
runner = CliRunner()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "GELBRIDGE_KEYRING"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gelbridge", *args], capture_output=True, text=True, timeout=60, env=full_env
    )


def test_keys_new_creates_file_and_prints_only_the_id(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    r = runner.invoke(app, ["keys", "new", "--keyring", str(ring), "--key-id", "phone-1"])
    assert r.exit_code == 0, r.output
    assert r.output == "phone-1\n"
    assert stat.S_IMODE(os.stat(ring).st_mode) == 0o600
    r2 = runner.invoke(app, ["keys", "new"], env={"GELBRIDGE_KEYRING": str(ring)})
    assert r2.exit_code == 0
    new_id = r2.output.strip()
    assert set(Keyring.load(ring)) == {"phone-1", new_id}
    key_b64 = json.loads(ring.read_text())["keys"][new_id]
    assert key_b64 not in r.output + r2.output


def test_keys_new_refuses_bad_or_duplicate_ids(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    runner.invoke(app, ["keys", "new", "--keyring", str(ring), "--key-id", "a"])
    r = runner.invoke(app, ["keys", "new", "--keyring", str(ring), "--key-id", "a"])
    assert r.exit_code == 1 and isinstance(r.exception, KeyringError)
    r = runner.invoke(app, ["keys", "new", "--keyring", str(ring), "--key-id", "no spaces"])
    assert r.exit_code == 1 and isinstance(r.exception, KeyringError)


def test_open_prints_the_example_with_content_opened() -> None:
    r = runner.invoke(app, ["open", "--keyring", str(EXAMPLE / "keyring.json"), str(EXAMPLE / "records.json")])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    values = [e["value"] for e in doc["records"]]
    assert values[0]["instructions"]["$type"] == "chat.gel.assistant.defs#plainContent"
    texts = [[p.get("text") for p in v["content"]["parts"]] for v in values[1:]]
    assert texts[0] == ["What is the capital of Australia?"]
    assert texts[1][1] == "Canberra." and values[2]["content"]["parts"][0]["$type"].endswith("#reasoningPart")
    assert values[3]["generation"] == {"attempt": 0, "effort": "low"}
    assert all("error" not in e for e in doc["records"])


def test_open_marks_records_it_cannot_open_and_exits_nonzero(tmp_path: Path) -> None:
    doc = json.loads((EXAMPLE / "records.json").read_text())
    recs = doc["records"]
    recs[1]["value"]["content"] = recs[3]["value"]["content"]  # ciphertext copied from another record
    recs[2]["value"]["content"]["keyId"] = "lost-key"
    recs.append({"uri": recs[0]["uri"].replace("conversation", "message") + "x", "value": {"$type": "chat.gel.assistant.message"}})
    recs.append({"uri": "at://did:plc:examplegelbridgedemo2345/app.bsky.feed.post/3k", "value": {"text": "public"}})
    path = tmp_path / "records.json"
    path.write_text(json.dumps(doc))
    p = run_cli("open", str(path), env={"GELBRIDGE_KEYRING": str(EXAMPLE / "keyring.json")})
    assert p.returncode == 1
    out = json.loads(p.stdout)["records"]
    errors = [e.get("error") for e in out]
    assert errors[0] is None and errors[3] is None and errors[5] is None
    assert "MovedCiphertextError" in errors[1] and recs[3]["uri"] in errors[1]
    assert "UnknownKeyError" in errors[2] and "lost-key" in errors[2]
    assert "RecordError" in errors[4]
    assert out[1]["value"]["content"]["$type"].endswith("#encryptedContent")  # printed as it was
    assert p.stderr.strip() == 'error: 3 of 6 records could not be opened (see their "error" fields)'


def test_open_without_keyring_is_one_clear_line(tmp_path: Path) -> None:
    p = run_cli("open", str(EXAMPLE / "records.json"))
    assert p.returncode == 1
    assert p.stderr == ("error: no keyring: pass --keyring FILE or set GELBRIDGE_KEYRING (or --bridge-key FILE, "
                        "to open with the keys the file's key grants give)\n")
    assert "Traceback" not in p.stderr


def test_open_bad_files_are_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nope": 1}')
    p = run_cli("open", "--keyring", str(EXAMPLE / "keyring.json"), str(bad))
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "listRecords" in p.stderr
    p = run_cli("open", "--keyring", str(tmp_path / "missing.json"), str(EXAMPLE / "records.json"))
    assert p.returncode == 1 and "keyring file" in p.stderr and "Traceback" not in p.stderr


def test_example_regenerates(tmp_path: Path) -> None:
    work = tmp_path / "conversation"
    shutil.copytree(EXAMPLE, work)
    (work / "records.json").unlink()
    subprocess.run([sys.executable, str(work / "make_example.py")], check=True, capture_output=True, timeout=60)
    r = runner.invoke(app, ["open", "--keyring", str(work / "keyring.json"), str(work / "records.json")])
    assert r.exit_code == 0, r.output


def test_version_and_short_help() -> None:
    from importlib.metadata import version

    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"gelbridge {version('gelbridge')}"
    r = runner.invoke(app, ["-h"])
    assert r.exit_code == 0 and "check" in r.output and "--install-completion" in r.output
    r = runner.invoke(app, ["open", "-h"])
    assert r.exit_code == 0 and "--keyring" in r.output


def test_open_prints_json_a_terminal_cannot_be_driven_by(tmp_path: Path) -> None:
    from gelbridge._records import MESSAGE_COLLECTION, AtUri, PlainContent, TextPart
    from gelbridge._sealing import seal_content

    # C0 (json escapes them itself), DEL, C1 (CSI, OSC, ST), bidi overrides and isolates,
    # a zero-width space, tag characters: the sealed text as a model or any writer may make it
    hostile = ("\x1b]0;owned\x07 \x7f \x9b2J \x9d52;c;b3duZWQ=\x9c \u202eevil\u202c \u2066x\u2069 "
               "a\u200bb \U000e0041 é 日本 👩\u200d👩")
    ring = Keyring.load(EXAMPLE / "keyring.json")
    uri = AtUri("did:plc:examplegelbridgedemo2345", MESSAGE_COLLECTION, "3mbd354z2m22b")
    sealed = seal_content(PlainContent(parts=[TextPart(text=hostile)]), uri=uri, key_id="example-key-1", keyring=ring)
    value = {"$type": MESSAGE_COLLECTION, "conversation": "3mbd3542k222b\u202e", "role": "user",
             "content": sealed.to_value(), "createdAt": "2026-01-01T00:00:01.000Z"}
    path = tmp_path / "records.json"
    path.write_text(json.dumps({"records": [{"uri": str(uri), "value": value}]}))
    p = subprocess.run([sys.executable, "-m", "gelbridge", "open", "--keyring", str(EXAMPLE / "keyring.json"),
                        str(path)], capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    for raw in ("\x1b", "\x07", "\x7f", "\x9b", "\x9d", "\x9c", "\u202e", "\u202c", "\u2066", "\u2069", "\u200b",
                "\u200d", "\U000e0041"):
        assert raw.encode() not in p.stdout, repr(raw)
    assert "é 日本 👩".encode() in p.stdout  # the rest is kept as it is, in UTF-8
    assert b"\\u001b]0;owned\\u0007 \\u007f \\u009b2J" in p.stdout and b"\\udb40\\udc41" in p.stdout
    doc = json.loads(p.stdout)  # still JSON, and the same text
    entry = doc["records"][0]["value"]
    assert entry["content"]["parts"][0]["text"] == hostile and entry["conversation"] == "3mbd3542k222b\u202e"
