"""The layers of gelbridge, enforced over its import graph.

Every module sits in one layer of ``LAYERS``, lowest first; a module imports only its
own layer or lower ones, and no import circle joins modules (within a layer either).
The graph counts every import a module can make: at module level, inside functions (a
lazy import is a dependency all the same), in ``TYPE_CHECKING`` blocks, and
``importlib.import_module`` with a literal name. ``from gelbridge.x import y`` where ``y``
is a submodule imports ``gelbridge.x.y``; an import of a package imports its
``__init__``. The implicit import of a parent package by Python is not an edge (a
package ``__init__`` that imports its own submodules is fine). A name computed at run
time is not seen (``[watch]``'s ``SOURCE_BUILDERS``; ``gelbridge/__init__.py`` names its
lazy exports again under ``TYPE_CHECKING``).

``KNOWN`` lists the violations that are still there, each to be removed; it can only
shrink (an entry that is no longer a violation fails too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: lowest first: a module may import its own layer and the layers before it.
#: core: pure (no I/O); shell: I/O at the edges (PDS, HTTP, sockets, state, Lua, logs);
#: worker: one account's turn engine and its sources; runtime: the processes that run
#: workers (one or many accounts, a fleet); cli: the commands; api: the public names.
LAYERS = ("core", "shell", "worker", "runtime", "cli", "api")

#: every top-level module or package of gelbridge → its layer (docs/architecture.md has
#: what each one is). A dotted key places a submodule apart from its package: the
#: longest key that names the module or a package of it wins.
LAYER_OF: dict[str, str] = {
    # core
    "_errors": "core",
    "_config": "core",
    "_records": "core",
    "lux": "core",
    "_thread": "core",
    "_mapping": "core",
    "_sealing": "core",  # crypto, but no I/O: content in, content out
    "_grants": "core",  # HPKE key grants: records in, keys out (and the key file, as _sealing's keyring)
    "_pairing": "core",  # the app side of key grants: which bridge to trust (pins), the grant record
    "_backoff": "core",
    "_oauth": "core",  # atproto OAuth's pure parts: ES256/JWS, DPoP proofs and nonces, scopes
    "_terminal": "core",
    "_config_keys": "core",
    # the pure parts of _tools, below _config and _mapping: the typed [tools.*] / [mcp.*]
    # tables that _config validates, approval resolution, the registry's types and names
    "_tools.config": "core",
    "_tools.approval": "core",
    "_tools.registry": "core",
    # shell
    "_transport": "shell",
    "_adapters": "shell",  # the Lua host and ModelClient (probe.py's pure part comes with them)
    "_tools": "shell",
    "_state": "shell",
    "_oauth.keeper": "shell",  # one refresher at a time, through the state store
    "_oauth.server": "shell",  # the authorization server over HTTP: discovery, PAR, tokens, revoke
    "_pds": "shell",
    "_firehose": "shell",  # frame decoding and the socket that reads the frames
    "_ingest": "shell",  # the cheap filter, pure, but over _firehose's frame decoding
    "_jetstream": "shell",  # a library API like _ingest; the worker's sources build on it
    "_identity": "shell",
    "_chat_client": "shell",  # the chat app's side: PDS and sealing, no worker
    "_observability": "shell",
    "_tracing": "shell",
    "_check": "shell",  # 'gelbridge check': the config against the world, no worker
    "_seams": "shell",  # the protocols the turn needs of the shell, in the shell's types
    # worker
    "_worker": "worker",
    # runtime
    "_runtime": "runtime",
    "_bridge": "runtime",
    "_fleet": "runtime",
    # cli
    "_cli": "cli",
    "__main__": "cli",
    # the 'gelbridge dev' and 'demo' machinery (dev PDS, PostgreSQL, model server, demo):
    # only the CLI (and the tests) use it, nothing in the service may
    "_dev": "cli",
    # api: gelbridge/__init__.py, the public API re-exports, is the top: nothing imports it
    "__init__": "api",
}

#: (importer, imported) edges that break the rules today, each one to be removed. The
#: test fails when one is no longer there (or no longer a violation): it only shrinks.
KNOWN: set[tuple[str, str]] = set()  # none left: the runtime refactor (issue 24) removed the last ones


@dataclass(frozen=True)
class Import:
    """One import of a module of the package by another: ``path:line`` is where."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} ({self.path}:{self.line})"


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name → file, for every module of ``root/package`` (``__init__.py``
    is the package itself)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` loads: itself, else its longest known prefix (``a.b`` for a
    name ``a.b.c`` that is not a module); None outside the package."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _imported_names(node: ast.Import | ast.ImportFrom | ast.Call, module: str, is_package: bool) -> Iterable[str]:
    """Every name ``node`` imports, absolute, with ``from x import y`` giving ``x.y``
    (a submodule, if there is one by that name) and ``x``."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(module, is_package, node.level, node.module)
        for alias in node.names:
            yield f"{source}.{alias.name}"
    elif (node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
          and ((isinstance(node.func, ast.Name) and node.func.id == "import_module")
               or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
        name = node.args[0].value
        level = len(name) - len(name.lstrip("."))
        yield _absolute(module, is_package, level, name[level:] or None) if level else name


def imports_of(root: Path, package: str) -> list[Import]:
    """Every import between modules of ``root/package``, one per (module, line, target)."""
    modules = modules_of(root, package)
    found: set[Import] = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
                continue
            for name in _imported_names(node, module, path.name == "__init__.py"):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    found.add(Import(module, target, path.relative_to(root).as_posix(), node.lineno))
    return sorted(found, key=lambda i: (i.importer, i.imported, i.line))


def first_lines(imports: Iterable[Import]) -> dict[tuple[str, str], Import]:
    """One import per (importer, imported) edge: the first line."""
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        edges.setdefault((imp.importer, imp.imported), imp)
    return edges


def circles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_of(module: str, table: Mapping[str, str]) -> str | None:
    """The layer of ``module`` (``pkg.a.b``): the longest key of ``table`` (``a.b``, ``a``)
    that names it or a package of it; the package's own ``__init__`` is key ``__init__``."""
    parts = module.split(".")[1:]
    if not parts:
        return table.get("__init__")
    while parts:
        layer = table.get(".".join(parts))
        if layer is not None:
            return layer
        parts.pop()
    return None


def upward(imports: Iterable[Import], table: Mapping[str, str], layers: tuple[str, ...] = LAYERS) -> list[Import]:
    """The imports from a lower layer to a higher one (a module not placed is left out:
    the check reports it as such)."""
    rank = {name: i for i, name in enumerate(layers)}
    found = []
    for imp in imports:
        low, high = layer_of(imp.importer, table), layer_of(imp.imported, table)
        if low is not None and high is not None and rank[low] < rank[high]:
            found.append(imp)
    return found


@dataclass
class Report:
    """What is wrong with a package's imports, one readable line (or block) each."""

    unplaced: list[str]
    circles: list[str]
    upward: list[str]
    stale: list[str]


def check(root: Path, package: str, table: Mapping[str, str], known: set[tuple[str, str]],
          layers: tuple[str, ...] = LAYERS) -> Report:
    """The rules over ``root/package``: every module placed in ``table``, no circle, no
    upward import, leaving out the edges of ``known``, each of which must still be a
    violation."""
    assert set(table.values()) <= set(layers), set(table.values()) - set(layers)
    imports = imports_of(root, package)
    edges = first_lines(imports)
    unplaced = sorted(m for m in modules_of(root, package) if layer_of(m, table) is None)

    circle_text = []
    for modules in circles(e for e in edges if e not in known):
        inside = set(modules)
        lines = [f"  {imp}" for (a, b), imp in edges.items() if a in inside and b in inside and (a, b) not in known]
        circle_text.append("circle of " + ", ".join(modules) + ":\n" + "\n".join(lines))

    rising = upward(imports, table, layers)
    rising_edges = {(i.importer, i.imported) for i in rising}
    circle_of = {m: i for i, c in enumerate(circles(edges)) for m in c}
    stale = [f"{a} -> {b}: " + ("no such import" if (a, b) not in edges else "no longer a violation")
             for a, b in sorted(known)
             if (a, b) not in rising_edges and not (a in circle_of and circle_of[a] == circle_of.get(b))]
    return Report(
        unplaced=unplaced,
        circles=circle_text,
        upward=[f"{imp} imports {layer_of(imp.imported, table)} from {layer_of(imp.importer, table)}"
                for imp in rising if (imp.importer, imp.imported) not in known],
        stale=stale,
    )


@pytest.fixture(scope="module")
def report() -> Report:
    return check(ROOT, "gelbridge", LAYER_OF, KNOWN)


def _none(found: list[str], what: str) -> None:
    if found:
        pytest.fail(f"{what}:\n" + "\n".join(found), pytrace=False)


def test_every_module_has_a_layer(report: Report) -> None:
    _none(report.unplaced, "modules without a layer: place each in LAYER_OF (tests/test_layers.py)")


def test_no_import_circle(report: Report) -> None:
    _none(report.circles, "import circles: break each at one of its imports")


def test_no_import_from_a_lower_layer_to_a_higher_one(report: Report) -> None:
    _none(report.upward, f"imports against the layers ({' < '.join(LAYERS)})")


def test_known_violations_only_go(report: Report) -> None:
    _none(report.stale, "fixed: remove from KNOWN (tests/test_layers.py)")


def test_the_graph_sees_the_whole_package() -> None:
    edges = first_lines(imports_of(ROOT, "gelbridge"))
    assert len(modules_of(ROOT, "gelbridge")) > 90 and len(edges) > 300
    # a lazy import, inside a function (Worker.start's tool loader), and a TYPE_CHECKING one
    assert ("gelbridge._worker.service", "gelbridge._tools") in edges
    assert ("gelbridge._seams", "gelbridge._pds") in edges


# --- the checker, over a little package of its own -----------------------------------


def _package(root: Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` (path under ``root`` → source) and return ``root``."""
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


PLACED = {"__init__": "api", "low": "core", "mid": "shell", "sub": "worker", "top": "runtime"}


def test_a_circle_is_named_with_one_import_line_per_edge(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "import os\n\n\ndef f():\n    from pkg import mid\n",
        "pkg/mid.py": "from pkg.low import f\nfrom pkg.low import f as g\n",
        "pkg/top.py": "import pkg.mid\n",
    })
    report = check(root, "pkg", PLACED, set())
    assert report.circles == ["circle of pkg.low, pkg.mid:\n"
                              "  pkg.low -> pkg.mid (pkg/low.py:5)\n"
                              "  pkg.mid -> pkg.low (pkg/mid.py:1)"]
    assert report.upward == ["pkg.low -> pkg.mid (pkg/low.py:5) imports shell from core"]
    assert report.unplaced == [] and report.stale == []
    # a known edge is left out of both, and must stay a violation
    assert check(root, "pkg", PLACED, {("pkg.low", "pkg.mid")}) == Report([], [], [], [])
    stale = check(root, "pkg", PLACED, {("pkg.top", "pkg.mid"), ("pkg.mid", "pkg.top")}).stale
    assert stale == ["pkg.mid -> pkg.top: no such import", "pkg.top -> pkg.mid: no longer a violation"]


def test_a_known_edge_between_two_circles_is_no_violation(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from pkg import mid\nfrom pkg import sub\n",
        "pkg/mid.py": "from pkg import low\n",
        "pkg/sub/__init__.py": "from pkg.sub import deep\n",
        "pkg/sub/deep.py": "import pkg.sub\n",
    })
    same = dict.fromkeys(["__init__", "low", "mid", "sub"], "core")
    report = check(root, "pkg", same, {("pkg.low", "pkg.sub"), ("pkg.low", "pkg.mid")})
    assert report.stale == ["pkg.low -> pkg.sub: no longer a violation"]
    assert [c.splitlines()[0] for c in report.circles] == ["circle of pkg.sub, pkg.sub.deep:"]


def test_an_upward_import_is_named_at_each_of_its_lines(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "import pkg.top\nfrom pkg.top import x\n",
        "pkg/top.py": "import pkg.low\nx = 1\n",
    })
    assert check(root, "pkg", PLACED, set()).upward == [
        "pkg.low -> pkg.top (pkg/low.py:1) imports runtime from core",
        "pkg.low -> pkg.top (pkg/low.py:2) imports runtime from core",
    ]
    # downward and within a layer are fine
    assert check(root, "pkg", {**PLACED, "low": "runtime"}, set()).upward == []


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "pkg/__init__.py": "from pkg.sub import deep\n",
        "pkg/low.py": (
            "from __future__ import annotations\n"
            "import importlib\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from pkg.mid import Thing\n"  # 5: a TYPE_CHECKING import
            "class C:\n"
            "    def run(self) -> None:\n"
            "        from .top import go\n"  # 8: lazy, relative
            "        importlib.import_module('pkg.sub.deep')\n"  # 9: by a literal name
            "        importlib.import_module(name)\n"  # not literal: not seen
            "from pkg import sub, nothing\n"  # 11: a subpackage and a name of pkg
            "import pkg.sub.deep.missing\n"  # 12: no such module: the deepest that is
        ),
        "pkg/mid.py": "Thing = 1\n",
        "pkg/top.py": "def go(): ...\n",
        "pkg/sub/__init__.py": "from . import deep\nfrom .. import low\nfrom ..mid import Thing\n",
        "pkg/sub/deep.py": "from . import *\n",
    })
    assert [(i.importer, i.imported, i.line) for i in imports_of(root, "pkg")] == [
        ("pkg", "pkg.sub.deep", 1),
        ("pkg.low", "pkg", 11),
        ("pkg.low", "pkg.mid", 5),
        ("pkg.low", "pkg.sub", 11),
        ("pkg.low", "pkg.sub.deep", 9),
        ("pkg.low", "pkg.sub.deep", 12),
        ("pkg.low", "pkg.top", 8),
        ("pkg.sub", "pkg.low", 2),
        ("pkg.sub", "pkg.mid", 3),
        ("pkg.sub", "pkg.sub.deep", 1),
        ("pkg.sub.deep", "pkg.sub", 1),
    ]


def test_a_module_without_a_layer_is_named(tmp_path: Path) -> None:
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "", "pkg/new.py": "", "pkg/sub/__init__.py": "",
                               "pkg/sub/deep.py": ""})
    assert check(root, "pkg", {"low": "core", "sub.deep": "shell"}, set()).unplaced == ["pkg", "pkg.new", "pkg.sub"]
    assert layer_of("pkg.sub.deep", {"sub": "worker", "sub.deep": "shell"}) == "shell"
    assert layer_of("pkg.sub.other", {"sub": "worker", "sub.deep": "shell"}) == "worker"
