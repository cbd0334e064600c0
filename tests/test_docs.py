"""The docs work when copied: every command block of README.md and docs/*.md runs, with
no network, as a reader would run it, and shows what it prints; every TOML block loads
as a configuration. A block that cannot run here says why in a marker (the convention:
CONTRIBUTING.md, "Docs"; the machinery: tests/testkit/docs.py).

A failure names the file and line of the block (and of the command), so a doc edit that
breaks one points straight at it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gelbridge._check import check_settings
from gelbridge._config import Settings, load_config
from gelbridge._errors import GelbridgeError
from gelbridge._sealing import Keyring
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
            report = asyncio.run(asyncio.wait_for(check_settings(settings, environ=env, login=False), 120))
            problems += [f"{b.where(REPO)}: gelbridge check (no login): {p}" for p in report.problems]
    assert loaded > 0 and problems == [], "\n".join(problems)


# --- command blocks ------------------------------------------------------------------------------


def _failure(block: Block, line: int, script: str, r: StepResult) -> str:
    status = r.note or f"exit code {r.rc}"
    at = failed_line(script, r.line)
    first = script.split("\n")[at - 1].strip()
    return (f"{_rel(block.doc)}:{line + at - 1} (block at line {block.line}): `{first}` failed: {status}\n"
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
