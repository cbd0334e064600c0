"""The fenced blocks of the Markdown docs, and running them as a reader would (tests/test_docs.py).

A block's fence language says what happens to it: ``sh``, ``bash``, ``shell`` and
``console`` blocks are run, ``toml`` blocks are loaded as a configuration; every other
language is prose to read. A marker, an HTML comment on the line right before the
fence, changes that (CONTRIBUTING.md, "Docs"):

    <!-- docs-test: skip (why it cannot run here) -->   not run; the reason is required
    <!-- docs-test: file NAME -->       written to NAME (relative) in the workspace, not run
    <!-- docs-test: background -->     a server: started, ready at its first line of output,
                                        stopped after the document's last block
    <!-- docs-test: check -->           toml: also the offline part of ``gelbridge check``

Several go in one comment, separated by ``;``. A run block whose lines start with
``$ `` is a terminal session: each ``$`` line (continued by a trailing ``\\``) is one
command, and the lines after it are its shown output, compared loosely
(:func:`output_mismatch`). Any other run block is one script (``set -e``).

Every run block of one document runs in order in one workspace (a copy of the
repository, its ``.venv`` linked, a home of its own), like one terminal: exports and
``cd`` carry over from block to block. Where the kernel allows it the whole
document runs in a network namespace of its own (``unshare``): only a loopback exists,
so a command that needs the network fails there, and a fixed port (``8765``) never
meets another process's. This file is also that run's driver: ``python docs.py PLAN``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_LANGS = frozenset({"sh", "bash", "shell", "console"})
MARKERS = ("skip", "file", "background", "check")
PROMPT = "$ "
#: seconds one command may take; one background block to print its first line
COMMAND_TIMEOUT = 120.0
READY_TIMEOUT = 60.0

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
_ANY_MARKER = re.compile(r"<!--\s*docs-test")


@dataclass(frozen=True)
class Marker:
    kind: str
    arg: str


@dataclass(frozen=True)
class Block:
    """One fenced block: ``line`` is the opening fence's line (1-based)."""

    doc: Path
    line: int
    lang: str
    text: str
    markers: tuple[Marker, ...] = ()
    problems: tuple[str, ...] = ()  # what is wrong with its markers

    def where(self, root: Path) -> str:
        return f"{self.doc.relative_to(root)}:{self.line} ({self.lang or 'no language'} block)"

    def marker(self, kind: str) -> Marker | None:
        return next((m for m in self.markers if m.kind == kind), None)

    @property
    def runs(self) -> bool:
        """Whether the doc test runs it as commands (else: skipped, a file, or prose; or
        its marker is malformed, which the test reports instead)."""
        return (self.lang in RUN_LANGS and not self.problems
                and self.marker("skip") is None and self.marker("file") is None)


@dataclass(frozen=True)
class Command:
    """One command to run: ``line`` is its line in the document; ``shown`` the output the
    document shows after it (prompt-style blocks only)."""

    line: int
    script: str
    shown: tuple[str, ...] = ()


@dataclass
class Document:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    stray_markers: list[int] = field(default_factory=list)  # marker lines not right before a fence


def _parse_markers(body: str) -> tuple[tuple[Marker, ...], tuple[str, ...]]:
    markers: list[Marker] = []
    problems: list[str] = []
    for item in (s.strip() for s in re.split(r";(?![^()]*\))", body)):  # not a ";" inside a reason
        kind, _, arg = item.partition(" ")
        arg = arg.strip()
        if kind not in MARKERS:
            problems.append(f"unknown marker {item!r} (known: {', '.join(MARKERS)})")
        elif kind == "skip" and not (arg.startswith("(") and arg.endswith(")") and arg[1:-1].strip()):
            problems.append("'skip' needs a reason in parentheses: <!-- docs-test: skip (why) -->")
        elif kind == "file" and (not arg or arg.startswith(("/", "~")) or ".." in Path(arg).parts):
            problems.append(f"'file' needs a relative path inside the workspace, not {arg!r}")
        elif kind in ("background", "check") and arg:
            problems.append(f"'{kind}' takes no argument ({arg!r})")
        else:
            markers.append(Marker(kind, arg[1:-1].strip() if kind == "skip" else arg))
    return tuple(markers), tuple(problems)


def parse_document(path: Path) -> Document:
    """Every fenced block of a Markdown file, with its markers."""
    lines = path.read_text(encoding="utf-8").split("\n")
    doc = Document(path)
    marker_lines: set[int] = set()
    used_markers: set[int] = set()
    i = 0
    while i < len(lines):
        if _ANY_MARKER.search(lines[i]):
            marker_lines.add(i)
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        lang = m["info"].strip().split(" ")[0].lower()
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        markers: tuple[Marker, ...] = ()
        problems: tuple[str, ...] = ()
        mm = _MARKER.match(lines[k]) if k >= 0 else None
        if mm:
            used_markers.add(k)
            markers, problems = _parse_markers(mm["body"])
        doc.blocks.append(Block(path, i + 1, lang, "\n".join(body), markers, problems))
        i = j + 1
    doc.stray_markers = sorted(n + 1 for n in marker_lines - used_markers)
    return doc


def block_problems(block: Block) -> list[str]:
    """What is wrong with a block's markers (an empty list: nothing)."""
    out = list(block.problems)
    kinds = [m.kind for m in block.markers]
    if block.marker("background") and block.lang not in RUN_LANGS:
        out.append("'background' is for sh/bash/console blocks")
    if block.marker("check") and block.lang != "toml":
        out.append("'check' is for toml blocks")
    if block.marker("skip") and len(kinds) > 1:
        out.append("'skip' goes alone: a skipped block is neither written nor run")
    if block.marker("background") and block.lang in RUN_LANGS and block.text.lstrip().startswith(PROMPT):
        out.append("a 'background' block is one server command, without '$ ' prompts or output")
    return out


def commands(block: Block) -> list[Command]:
    """The commands of a run block: one per ``$`` line in a terminal session, else the whole block."""
    lines = block.text.split("\n")
    if not any(ln.startswith(PROMPT) for ln in lines):
        return [Command(block.line + 1, block.text)]
    out: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(PROMPT):
            i += 1  # text before the first prompt: not a command
            continue
        start = i
        cmd = [lines[i][len(PROMPT):]]
        while cmd[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd.append(lines[i])
        i += 1
        shown: list[str] = []
        while i < len(lines) and not lines[i].startswith(PROMPT):
            if lines[i].strip() and not lines[i].strip().startswith("#"):  # a comment is not output
                shown.append(lines[i])
            i += 1
        out.append(Command(block.line + 1 + start, "\n".join(cmd), tuple(shown)))
    return out


# --- shown output ---------------------------------------------------------------------------

_JSON_KEY = re.compile(r'"((?:[^"\\]|\\.)+)"\s*:')
_TOKEN = re.compile(r"[A-Za-z0-9]{8,}")


def _keys(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def _line_pattern(shown: str) -> re.Pattern[str]:
    """A shown line as a pattern: ``...`` matches anything, and a token of 8 or more
    letters and digits with both in it (a key id, a hash) matches any such token."""
    out = []
    for piece in re.split(r"(\.\.\.|…)", shown.strip()):
        if piece in ("...", "…"):
            out.append(".*")
            continue
        pos = 0
        for t in _TOKEN.finditer(piece):
            out.append(re.escape(piece[pos:t.start()]))
            word = t.group()
            random_like = any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
            out.append("[A-Za-z0-9]+" if random_like else re.escape(word))
            pos = t.end()
        out.append(re.escape(piece[pos:]))
    return re.compile("".join(out))


def output_mismatch(shown: tuple[str, ...], stdout: str) -> str | None:
    """How the real output differs from the shown one (None: it matches, loosely).

    Shown JSON (any ``"key":`` in it): the output must be JSON holding every key shown,
    at any depth. Otherwise the first shown line must match the first line of output,
    ``...`` standing for anything and random-looking tokens for any other.
    """
    if not shown:
        return None
    keys = set(_JSON_KEY.findall("\n".join(shown)))
    if keys:
        try:
            real = json.loads(stdout)
        except ValueError:
            return f"the document shows JSON, the command printed: {stdout[:300]!r}"
        missing = sorted(keys - _keys(real))
        return f"keys shown but not in the output: {', '.join(missing)}" if missing else None
    first = next((ln for ln in stdout.splitlines() if ln.strip()), "")
    if not _line_pattern(shown[0]).fullmatch(first.strip()):
        return f"the document shows {shown[0].strip()!r} first, the command printed {first.strip()!r}"
    return None


# --- the workspace and the run ------------------------------------------------------------------


def make_workspace(repo: Path, where: Path) -> Path:
    """A copy of the repository's files (tracked, and new ones git does not ignore) where
    its relative paths work as in a checkout and what a command writes stays; only
    ``.venv`` is a link to the real one (a block must not change it)."""
    repo = repo.resolve()
    where.mkdir(parents=True, exist_ok=True)
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = repo / rel
        if src.is_file():
            (where / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, where / rel)
    (where / ".venv").symlink_to(repo / ".venv")
    (where / ".home").mkdir()
    return where


def reader_env(workspace: Path) -> dict[str, str]:
    """The environment of a reader's shell: the repository's ``.venv/bin`` first on PATH,
    a home of its own (so no shared cache, e.g. the reference PDS's, is ever touched), no
    gelbridge or provider variables, outbound HTTP(S) proxied to a closed loopback port
    (for when no network namespace can be made)."""
    closed = "http://127.0.0.1:9"
    return {
        "PATH": f"{workspace / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(workspace / ".home"),
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "COLUMNS": "100",
        "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "ALL_PROXY": closed,
        "http_proxy": closed, "https_proxy": closed, "all_proxy": closed,
        "NO_PROXY": "127.0.0.1,localhost,::1", "no_proxy": "127.0.0.1,localhost,::1",
    }


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """``unshare`` arguments for a network (and PID) namespace of the run's own, or ()
    where the kernel or the tool refuses. In the PID namespace the driver is process 1:
    when it ends, every process it left is ended too. Root needs no user namespace (and
    keeps its access to files of other users); anyone else maps themselves to root in one."""
    if shutil.which("unshare") is None:
        return ()
    base = ("unshare", "--net", "--pid", "--fork", "--kill-child")
    tries = [base, (*base, "--map-root-user")] if os.geteuid() == 0 else [(*base, "--map-root-user")]
    for argv in tries:
        try:
            if subprocess.run([*argv, "true"], capture_output=True, timeout=20).returncode == 0:
                return argv
        except (OSError, subprocess.TimeoutExpired):
            pass
    return ()


@dataclass(frozen=True)
class StepResult:
    id: int
    rc: int | None  # None: timed out, or never became ready
    stdout: str
    stderr: str
    note: str = ""
    seconds: float = 0.0
    line: int | None = None  # the failing line of the step's script, as bash saw it


def run_plan(steps: list[dict[str, Any]], workspace: Path, env: dict[str, str], *, timeout: float) -> list[StepResult]:
    """Run ``steps`` (``{"id", "kind": run|background|file, ...}``) in order in ``workspace``
    (isolated where possible); stops after the first step that fails."""
    state = workspace / ".docs-test"
    state.mkdir(exist_ok=True)
    plan = state / "plan.json"
    plan.write_text(json.dumps({"workspace": str(workspace), "env": env, "steps": steps}), encoding="utf-8")
    argv = [*isolation_prefix(), sys.executable, str(Path(__file__).resolve()), str(plan)]
    proc = subprocess.Popen(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"the document's blocks took more than {timeout:g} s in all") from None
    if proc.returncode != 0:
        raise AssertionError(f"the docs driver failed ({proc.returncode}): {err[-2000:]}")
    return [StepResult(**r) for r in json.loads(out)]


# --- the driver (runs inside the namespace) -----------------------------------------------------


def _loopback_up() -> None:
    """Bring ``lo`` up in a fresh network namespace (there it starts down)."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, req))[1]
        if not flags & iff_up:
            fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def _wrapper(state: Path, script: str, *, keep_state: bool) -> tuple[str, int]:
    """The bash a step runs, and the line of it where ``script`` starts: the previous
    step's exports and folder, ``set -e``, the line that fails noted, the script, and (for
    a foreground step) its exports and folder saved for the next."""
    q = {name: shlex.quote(str(state / name)) for name in ("env.sh", "cwd", "errline")}
    head = [f". {q['env.sh']}", f'cd "$(cat {q["cwd"]})"']
    if keep_state:
        head.append(f"trap '__rc=$?; export -p > {q['env.sh']}; pwd > {q['cwd']}; exit $__rc' EXIT")
    head += [f"trap 'echo $LINENO > {q['errline']}' ERR", "set -eo pipefail"]
    return "\n".join([*head, script, ""]), len(head) + 1


def failed_line(script: str, line: int | None) -> int:
    """The first line (1-based, in ``script``) of the command that holds line ``line``
    (what bash's ``$LINENO`` said when the command failed; a command continued with a
    trailing backslash spans several lines). 1 when unknown."""
    lines = script.split("\n")
    if line is None or not 1 <= line <= len(lines):
        return 1
    start = 1
    for n in range(1, line):
        if not lines[n - 1].endswith("\\"):
            start = n + 1
    return start


def _tail(path: Path, limit: int = 1 << 20) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-limit:] if path.exists() else ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _drive(plan_path: Path) -> list[dict[str, Any]]:
    plan = json.loads(plan_path.read_text(encoding="utf-8"))
    workspace = Path(plan["workspace"])
    state = plan_path.parent
    try:
        _loopback_up()
    except OSError:
        pass  # not in a namespace of our own: the host's loopback is up
    (state / "env.sh").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in plan["env"].items()))
    (state / "cwd").write_text(str(workspace))
    results: list[dict[str, Any]] = []
    background: list[subprocess.Popen[bytes]] = []
    try:
        for step in plan["steps"]:
            sid, kind = step["id"], step["kind"]
            out, err = state / f"{sid}.out", state / f"{sid}.err"
            if kind == "file":
                path = Path((state / "cwd").read_text().strip()) / step["name"]  # where the reader's shell is
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(step["text"] + "\n", encoding="utf-8")
                results.append({"id": sid, "rc": 0, "stdout": "", "stderr": ""})
                continue
            script, first = _wrapper(state, step["script"], keep_state=kind == "run")
            (state / "errline").unlink(missing_ok=True)
            t0 = time.monotonic()
            with out.open("wb") as o, err.open("wb") as e:
                proc = subprocess.Popen(["bash", "-c", script], cwd=workspace, env=plan["env"],
                                        stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
            if kind == "background":
                background.append(proc)
                deadline = time.monotonic() + READY_TIMEOUT
                while time.monotonic() < deadline and proc.poll() is None and b"\n" not in out.read_bytes():
                    time.sleep(0.1)
                ready = b"\n" in out.read_bytes() and proc.poll() is None
                results.append({"id": sid, "rc": 0 if ready else proc.poll(), "stdout": _tail(out),
                                "stderr": _tail(err), "seconds": time.monotonic() - t0,
                                "note": "" if ready else f"no line of output within {READY_TIMEOUT:g} s, or it exited"})
                if not ready:
                    break
                continue
            try:
                rc: int | None = proc.wait(timeout=COMMAND_TIMEOUT)
                note = ""
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc, note = None, (f"still running after {COMMAND_TIMEOUT:g} s (a server? mark its block "
                                  "<!-- docs-test: background --> or skip it with a reason)")
            errline = (state / "errline").read_text().strip() if (state / "errline").exists() else ""
            results.append({"id": sid, "rc": rc, "stdout": _tail(out), "stderr": _tail(err), "note": note,
                            "seconds": time.monotonic() - t0,
                            "line": int(errline) - first + 1 if errline.isdigit() and rc else None})
            if rc != 0:
                break
    finally:
        for proc in background:
            _stop(proc)
    return results


if __name__ == "__main__":
    print(json.dumps(_drive(Path(sys.argv[1]))))
