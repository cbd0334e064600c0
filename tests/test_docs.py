"""The docs work when copied: every command block of README.md and docs/*.md runs, with
no network, as a reader would run it, and shows what it prints; every TOML block loads
as a configuration. A block that cannot run here says why in a marker (the convention:
CONTRIBUTING.md, "Docs"; the machinery: tests/testkit/docs.py).

A failure names the file and line of the block (and of the command), so a doc edit that
breaks one points straight at it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gelbridge import _sealing as sealing
from gelbridge._check import check_settings
from gelbridge._config import Settings, load_config
from gelbridge._errors import GelbridgeError
from gelbridge._records import codec
from gelbridge._records.constants import COLLECTIONS, ENCRYPTED_CONTENT_TYPE, PLAIN_CONTENT_TYPE, ReplyStatus
from gelbridge._records.models import EncryptedContent, PlainContent, parse_record
from gelbridge._sealing import Keyring
from gelbridge._worker.decide import REPLY_ERROR_KINDS
from testkit.docs import (
    Block,
    Document,
    StepResult,
    block_problems,
    commands,
    failed_line,
    make_workspace,
    output_mismatch,
    parse_document,
    reader_env,
    run_plan,
)

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PARSED = {p: parse_document(p) for p in DOCS}
#: first words of a command line: an unlabelled block starting so must say what it is
_COMMAND_START = ("$ ", "gelbridge ", ".venv/", "bash ", "python ", "pip ", "export ")


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def _with(lang_test: str) -> list[Document]:
    """The documents that have blocks of the kind ``lang_test`` names (run / toml)."""
    if lang_test == "run":
        return [d for d in PARSED.values() if any(b.runs for b in d.blocks)]
    return [d for d in PARSED.values() if any(b.lang == "toml" and not b.marker("skip") for b in d.blocks)]


def test_every_marker_is_well_formed_and_every_command_block_is_labelled() -> None:
    problems = []
    blocks = 0
    for doc in PARSED.values():
        for line in doc.stray_markers:
            problems.append(f"{_rel(doc.path)}:{line}: a docs-test marker that is not on the line right "
                            "before a fence does nothing: move it there")
        for b in doc.blocks:
            blocks += 1
            problems += [f"{b.where(REPO)}: {p}" for p in block_problems(b)]
            first = next((ln for ln in b.text.split("\n") if ln.strip()), "")
            if not b.lang and first.lstrip().startswith(_COMMAND_START):
                problems.append(f"{b.where(REPO)}: a block of commands without a language is never run: "
                                "label it ```sh (run, or marked skip with a reason) or ```text")
    assert blocks > 25, "the docs lost their blocks, or the parser lost the fences"
    assert problems == [], "\n".join(problems)


def test_the_parser_reads_markers_prompts_and_shown_output(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("text\n\n<!-- docs-test: skip (needs a PDS; and a key) -->\n```sh\ngelbridge run\n```\n\n"
                  "   <!-- docs-test: file a/my.toml; check -->\n   ```toml\n   [thread]\n   max_depth = 5\n   ```\n"
                  "```console\n$ echo a \\\n    b\na b\n  # a comment, not output\n\n$ true\n```\n"
                  "<!-- docs-test: skipp -->\n```sh\nx\n```\n<!-- docs-test: skip -->\n\ntext\n")
    doc = parse_document(md)
    skip, toml, console, typo = doc.blocks
    assert skip.marker("skip") is not None and skip.marker("skip").arg == "needs a PDS; and a key" and not skip.runs
    assert toml.lang == "toml" and toml.text == "[thread]\nmax_depth = 5"
    assert [m.kind for m in toml.markers] == ["file", "check"] and toml.marker("file").arg == "a/my.toml"
    cmds = commands(console)
    assert [(c.line, c.script, c.shown) for c in cmds] == [
        (console.line + 1, "echo a \\\n    b", ("a b",)), (console.line + 6, "true", ())]
    assert typo.problems and "unknown marker" in typo.problems[0] and not typo.runs
    assert doc.stray_markers == [len(md.read_text().split("\n")) - 3]


def test_a_failure_is_placed_on_the_command_that_failed() -> None:
    script = "mkdir -p a\ngelbridge convert \\\n    --message x \\\n    records.json\nls"
    assert [failed_line(script, n) for n in (1, 2, 3, 4, 5, None, 99)] == [1, 2, 2, 2, 5, 1, 1]


def test_shown_output_is_compared_loosely_but_not_blindly() -> None:
    assert output_mismatch(("k-3f9a0c6e1b2d4a57",), "k-0123456789abcdef\n") is None
    assert output_mismatch(("k-3f9a0c6e1b2d4a57",), "error: no keyring\n") is not None
    assert output_mismatch(('{"records": [ ... ]}',), '{"records": [], "cursor": "x"}') is None
    assert "records" in (output_mismatch(('{"records": [ ... ]}',), '{"items": []}') or "")
    assert output_mismatch(('{"records": [ ... ]}',), "not json") is not None
    assert output_mismatch(("model server listening on http://127.0.0.1:8765 (Ctrl-C to stop)",),
                           "model server listening on http://127.0.0.1:8765 (Ctrl-C to stop)\n") is None
    assert output_mismatch(("listening on 8765",), "listening on 8766") is not None


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation out, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(ln.lstrip("#")) for ln in doc.read_text(encoding="utf-8").split("\n") if ln.startswith("#")}


def test_every_link_of_the_docs_stays_inside_the_repository_and_finds_its_target() -> None:
    broken = []
    links = 0
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").split("\n"), 1):
            for target in _LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto: ...
                links += 1
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                if REPO not in dest.parents and dest != REPO:
                    broken.append(f"{_rel(doc)}:{n}: {target} is outside the repository (a clone has no such file)")
                elif not dest.exists():
                    broken.append(f"{_rel(doc)}:{n}: {target} does not exist")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{_rel(doc)}:{n}: {target}: no heading with that anchor in {_rel(dest)}")
    assert links > 20 and broken == [], "\n".join(broken)


# --- TOML blocks ---------------------------------------------------------------------------------


def _toml_path(workspace: Path, block: Block) -> Path:
    name = block.marker("file")
    return workspace / (name.arg if name else f"{block.doc.stem}-{block.line}.toml")


def _secrets_env(settings: Settings) -> dict[str, str]:
    """What a reader exports before ``gelbridge check``: every secret variable the file
    names, set (to a stand-in: nothing here logs in or calls a provider)."""
    names = {p.api_key_env for p in settings.providers.values() if p.api_key_env}
    names |= {settings.account.password_env, *(a.password_env for a in settings.accounts)}
    return {n: "docs-test-stand-in" for n in names if n}


def _keyrings_made(settings: Settings) -> None:
    """The keyrings the file names, made as the README says (``gelbridge keys new``)."""
    for acct in settings.accounts_list():
        path = settings.for_account(acct).keyring.path if settings.accounts else settings.keyring.path
        if path is not None and not Path(path).exists():
            ring = Keyring()
            ring.add_new()
            ring.save(path)


@pytest.mark.parametrize("doc", _with("toml"), ids=lambda d: _rel(d.path))
def test_toml_blocks_load_as_configurations(doc: Document, tmp_path: Path) -> None:
    workspace = make_workspace(REPO, tmp_path / "ws")
    problems = []
    loaded = 0
    for b in doc.blocks:
        if b.lang != "toml" or b.marker("skip"):
            continue
        path = _toml_path(workspace, b)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.text + "\n", encoding="utf-8")
        try:
            settings = load_config(path, env={})
        except GelbridgeError as e:
            problems.append(f"{b.where(REPO)}: does not load: {e}")
            continue
        loaded += 1
        if b.marker("check"):
            _keyrings_made(settings)
            env = {**reader_env(workspace), **_secrets_env(settings)}
            report = asyncio.run(asyncio.wait_for(check_settings(settings, environ=env, login=False, probe=False), 120))
            problems += [f"{b.where(REPO)}: gelbridge check (no login): {p}" for p in report.problems]
    assert loaded > 0 and problems == [], "\n".join(problems)


# --- command blocks ------------------------------------------------------------------------------


def _failure(block: Block, line: int, script: str, r: StepResult) -> str:
    status = r.note or f"exit code {r.rc}"
    at = failed_line(script, r.line)
    first = script.split("\n")[at - 1].strip()
    return (f"{_rel(block.doc)}:{line + at - 1} (block at line {block.line}): `{first}` failed: {status}\n"
            "(it runs with no network, in a copy of the repository; a block that cannot, e.g. it needs a PDS or "
            "an API key, says so: <!-- docs-test: skip (why) --> on the line before its fence)\n"
            f"--- stdout (end) ---\n{r.stdout[-1500:]}\n--- stderr (end) ---\n{r.stderr[-1500:]}")


@pytest.mark.parametrize("doc", _with("run"), ids=lambda d: _rel(d.path))
def test_command_blocks_run_as_shown(doc: Document, tmp_path: Path) -> None:
    workspace = make_workspace(REPO, tmp_path / "ws")
    steps: list[dict[str, object]] = []
    where: dict[int, tuple[Block, int, str, tuple[str, ...]]] = {}
    for b in doc.blocks:
        if b.marker("skip") or b.problems:  # a malformed marker: the marker test says so
            continue
        if b.marker("file"):
            steps.append({"id": len(steps), "kind": "file", "name": b.marker("file").arg, "text": b.text})
            where[len(steps) - 1] = (b, b.line, "(write the file)", ())
        elif b.runs:
            kind = "background" if b.marker("background") else "run"
            for c in commands(b):
                where[len(steps)] = (b, c.line, c.script, c.shown)
                steps.append({"id": len(steps), "kind": kind, "script": c.script})
    results = run_plan(steps, workspace, reader_env(workspace), timeout=280)
    problems = []
    for r in results:
        block, line, script, shown = where[r.id]
        if r.rc != 0:
            problems.append(_failure(block, line, script, r))
            break
        mismatch = output_mismatch(shown, r.stdout)
        if mismatch:
            problems.append(f"{_rel(block.doc)}:{line} (block at line {block.line}): {mismatch}")
    ran = len(results)
    assert problems == [], "\n\n".join(problems)
    assert ran == len(steps), f"only {ran} of {len(steps)} steps ran"


# --- docs/protocol.md: the wire protocol an app builds against ---------------------------------

PROTOCOL = REPO / "docs" / "protocol.md"
LEXICONS = sorted((REPO / "lexicons").rglob("*.json"))


def _json_blocks(doc: Path) -> list[tuple[Block, Any]]:
    out = []
    for b in PARSED[doc].blocks:
        if b.lang == "json":
            try:
                out.append((b, json.loads(b.text)))
            except ValueError as e:
                raise AssertionError(f"{b.where(REPO)}: not JSON ({e})") from None
    return out


def _example(key: str) -> dict[str, Any]:
    found = [v for _, v in _json_blocks(PROTOCOL) if isinstance(v, dict) and key in v]
    assert len(found) == 1, f"docs/protocol.md: expected one JSON block with {key!r}, found {len(found)}"
    return found[0]


def _user_message_example() -> dict[str, Any]:
    found = [v for _, v in _json_blocks(PROTOCOL) if isinstance(v, dict) and v.get("role") == "user"
             and isinstance(v.get("content"), dict) and v["content"].get("$type") == ENCRYPTED_CONTENT_TYPE]
    assert len(found) == 1, "docs/protocol.md: expected one sealed user message example"
    return found[0]


def _lexicon_names(node: Any, out: set[str]) -> None:
    """Every property name and known value below a lexicon node."""
    if isinstance(node, dict):
        out.update(node.get("properties", {}))
        out.update(v for v in node.get("knownValues", []) if isinstance(v, str))
        for v in node.values():
            _lexicon_names(v, out)
    elif isinstance(node, list):
        for v in node:
            _lexicon_names(v, out)


def test_the_protocol_doc_names_every_collection_def_field_and_known_value_of_the_lexicons() -> None:
    text = PROTOCOL.read_text(encoding="utf-8")
    missing = []
    assert len(LEXICONS) >= 4
    for path in LEXICONS:
        lex = json.loads(path.read_text(encoding="utf-8"))
        if f"`{lex['id']}`" not in text:
            missing.append(f"{lex['id']} (collection or defs NSID)")
        for name, node in lex["defs"].items():
            if name != "main" and f"`{name}`" not in text and f"#{name}`" not in text:
                missing.append(f"{lex['id']}#{name} (def)")
            names: set[str] = set()
            _lexicon_names(node, names)
            missing += [f"{lex['id']}#{name}: `{n}`" for n in sorted(names) if f"`{n}`" not in text]
    assert missing == [], "docs/protocol.md does not mention:\n" + "\n".join(missing)


def _table_keys(header: str) -> set[str]:
    """The first cells of the body rows of the protocol doc's table whose header starts
    with ``| `header` |``."""
    lines = PROTOCOL.read_text(encoding="utf-8").split("\n")
    starts = [i for i, ln in enumerate(lines[:-1]) if ln.startswith(f"| `{header}` |") and lines[i + 1].startswith("|-")]
    assert len(starts) == 1, f"docs/protocol.md: expected one table headed `{header}`"
    rows = []
    for ln in lines[starts[0] + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(ln.split("|")[1].strip().strip("`"))
    return set(rows)


def test_the_protocol_doc_lists_exactly_the_statuses_and_error_kinds_gelbridge_writes() -> None:
    assert _table_keys("status") == {str(s) for s in ReplyStatus}
    assert _table_keys("error.kind") == set(REPLY_ERROR_KINDS)


def test_the_record_examples_of_the_protocol_doc_are_valid_records() -> None:
    checked = 0
    for b, v in _json_blocks(PROTOCOL):
        if not isinstance(v, dict):
            continue
        t = v.get("$type")
        try:
            if t in COLLECTIONS:
                parse_record(t, v, uri=f"docs/protocol.md:{b.line}")
            elif t == PLAIN_CONTENT_TYPE:
                PlainContent.from_value(v)
            elif isinstance(t, str) and t.startswith("chat.gel.assistant.defs#") and t.endswith("Part"):
                PlainContent.from_value({"$type": PLAIN_CONTENT_TYPE, "parts": [v]})
            else:
                continue
        except GelbridgeError as e:
            raise AssertionError(f"{b.where(REPO)}: not a valid {t}: {e}") from None
        checked += 1
    assert checked >= 5


def test_the_sealing_example_opens_with_gelbridge_and_seals_back_to_the_same_bytes() -> None:
    ex = _example("associatedData")
    key = base64.b64decode(ex["key"], validate=True)
    ring = Keyring({ex["keyId"]: key})
    assert ex["associatedData"].encode() == sealing._ad(ex["uri"], ex["keyId"])  # what gelbridge binds
    record = _user_message_example()
    assert record["content"]["keyId"] == ex["keyId"]
    assert record["content"]["nonce"] == {"$bytes": ex["nonce"]} and record["content"]["ciphertext"] == {
        "$bytes": ex["ciphertext"]}
    enc = EncryptedContent.from_value(record["content"])
    opened = sealing.open_content(enc, uri=ex["uri"], keyring=ring)
    assert opened.to_value() == json.loads(ex["plaintext"])
    assert sealing.open_bytes(enc, uri=ex["uri"], keyring=ring) == ex["plaintext"].encode()
    again = sealing._encrypt(ex["plaintext"].encode(), sealing._ad(ex["uri"], ex["keyId"]), enc.nonce, key)
    assert codec.b64encode(again) == ex["ciphertext"]
    with pytest.raises(GelbridgeError):  # the same bytes in another record do not open
        sealing.open_content(enc, uri=ex["uri"] + "x", keyring=ring)


def test_the_python_sealing_code_of_the_protocol_doc_works_with_gelbridge() -> None:
    snippets = [b for b in PARSED[PROTOCOL].blocks if b.lang == "python" and "def seal(" in b.text]
    assert len(snippets) == 1
    code: dict[str, Any] = {}
    exec(compile(snippets[0].text, f"{PROTOCOL}:{snippets[0].line}", "exec"), code)  # our own doc
    ex = _example("associatedData")
    key = base64.b64decode(ex["key"])
    ring = Keyring({ex["keyId"]: key})
    value = json.loads(ex["plaintext"])
    fixed = code["seal"](value, uri=ex["uri"], key_id=ex["keyId"], key=key, nonce=code["unb64"](ex["nonce"]))
    assert fixed == _user_message_example()["content"]
    fresh = code["seal"](value, uri=ex["uri"], key_id=ex["keyId"], key=key)
    assert fresh["nonce"] != fixed["nonce"]
    assert sealing.open_content(EncryptedContent.from_value(fresh), uri=ex["uri"], keyring=ring).to_value() == value
    ours = sealing.seal_content(PlainContent.from_value(value), uri=ex["uri"], key_id=ex["keyId"], keyring=ring)
    assert code["open_sealed"](ours.to_value(), uri=ex["uri"], key=key) == value
    assert sealing.open_blob(code["seal_blob"](b"%PDF-1.7", key_id=ex["keyId"], key=key), key_id=ex["keyId"],
                             keyring=ring) == b"%PDF-1.7"


def test_the_key_grant_example_opens_with_hpke_to_the_sealing_example_key() -> None:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hpke, serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    ex, key_ex = _example("bridgePrivateKey"), _example("associatedData")
    bridge, grant = ex["bridge"], ex["grant"]
    private = X25519PrivateKey.from_private_bytes(codec.b64decode(ex["bridgePrivateKey"]))
    public = codec.b64decode(bridge["record"]["publicKey"]["$bytes"])
    assert private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == public
    digest = hashlib.sha256(public).hexdigest()[:24]
    assert bridge["fingerprint"] == "-".join(digest[i:i + 4] for i in range(0, 24, 4))
    record = grant["record"]
    assert bridge["uri"].rsplit("/", 1)[1] == record["recipient"] and record["keyId"] == key_ex["keyId"]
    info = "\n".join([record["scheme"], grant["uri"], record["keyId"], record["recipient"]])
    assert grant["info"] == info
    sealed = codec.b64decode(record["sealedKey"]["$bytes"])
    assert len(sealed) == 80
    suite = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
    assert suite.decrypt(sealed, private, info.encode()) == base64.b64decode(key_ex["key"])
    with pytest.raises(InvalidTag):  # relabelled for another keyId, it does not open
        suite.decrypt(sealed, private, info.replace(record["keyId"], "other-key").encode())
    # and gelbridge's own grant code honours the example as a running bridge would
    from gelbridge._grants import BridgeKey, BridgeKeys, fingerprint, read_grant

    did, rkey = grant["uri"].split("/")[2], grant["uri"].rsplit("/", 1)[1]
    bridge_key = BridgeKey.from_private_bytes(codec.b64decode(ex["bridgePrivateKey"]), kid=record["recipient"],
                                              name=bridge["record"]["name"])
    assert fingerprint(public) == bridge_key.fingerprint == bridge["fingerprint"]
    assert bridge_key.is_published_by(bridge["record"])
    verdict = read_grant(record, did=did, rkey=rkey, bridge=BridgeKeys([bridge_key]))
    assert verdict.honoured and verdict.key == base64.b64decode(key_ex["key"])
    assert read_grant(record, did=did, rkey="3mbd3abcdef23", bridge=BridgeKeys([bridge_key])).code == "sealed_key"
