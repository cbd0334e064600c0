"""The tests mirror the package, so a module's tests are where its name says.

``tests/<name>/`` holds the tests of gelbridge's package or module ``<name>`` (``_<name>``
when private), ``tests/<name>/<sub>/`` those of its module ``<sub>``, and
``tests/test_<name>.py`` those of a small module. The only other folders are
``integration/`` (the whole service end to end on the real PDS), ``fuzz/`` (hostile input
across modules) and ``testkit/`` (shared helpers); a folder with no test files (Lua
fixtures) is data.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "gelbridge"
CROSS_CUTTING = {"integration", "fuzz", "testkit"}
#: test folders for what is not a Python module: the built-in Lua adapters (adapters/*.lua)
NOT_MODULES = {"adapters/builtin"}
#: top-level test files about the package as a whole (test_docs.py: its README and docs/;
#: test_layers.py: its import graph; test_function_size.py: the size of the functions of
#: _worker/ and _mapping/)
WHOLE_PACKAGE = {"test_public_api.py", "test_layout.py", "test_docs.py", "test_layers.py", "test_function_size.py"}


def _module(parent: Path, name: str) -> Path | None:
    for candidate in (parent / f"_{name}", parent / name, parent / f"_{name}.py", parent / f"{name}.py"):
        if candidate.exists():
            return candidate
    return None


def _has_tests(folder: Path) -> bool:
    return any(folder.glob("test_*.py"))


def test_every_test_folder_names_a_module_of_the_package() -> None:
    strays = []
    folders = 0
    for folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
                         and any(folder_file for folder_file in p.rglob("*.py"))):  # not a stale __pycache__
        if folder.name in CROSS_CUTTING:
            continue
        folders += 1
        package = _module(PACKAGE, folder.name)
        if package is None:
            strays.append(folder.name)
            continue
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and _has_tests(p)):
            rel = f"{folder.name}/{sub.name}"
            if rel not in NOT_MODULES and (not package.is_dir() or _module(package, sub.name) is None):
                strays.append(rel)
    assert folders >= 15 and strays == []


def test_every_top_level_test_file_names_a_module() -> None:
    files = sorted(p.name for p in TESTS.glob("test_*.py"))
    strays = [f for f in files if f not in WHOLE_PACKAGE and _module(PACKAGE, f[len("test_"):-len(".py")]) is None]
    assert len(files) >= 5 and strays == []


def test_the_rule_catches_a_stray_folder() -> None:
    assert _module(PACKAGE, "worker") is not None and _module(PACKAGE, "lux") is not None
    assert _module(PACKAGE, "adapters_host") is None and _module(PACKAGE, "providers") is None
