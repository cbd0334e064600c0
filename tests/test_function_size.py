"""The turn's modules stay in small phases (issue 24): no function or method in
``gelbridge/_worker/`` or ``gelbridge/_mapping/`` is longer than 60 lines, from its
``def`` line to its last line, docstring included. Their McCabe complexity (at most 15)
is ruff's C901, run over the same folders by ``scripts/lint.sh``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("gelbridge/_worker", "gelbridge/_mapping", "gelbridge/_runtime")
MAX_LINES = 60


def oversized(source: str, max_lines: int = MAX_LINES) -> list[tuple[str, int, int]]:
    """``(qualified name, def line, lines)`` of every function or method in ``source``
    (nested ones too) longer than ``max_lines``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > max_lines:
                    found.append((name, child.lineno, lines))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def checked_files() -> list[Path]:
    return sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py"))


def test_no_function_of_the_turn_modules_is_over_60_lines() -> None:
    files = checked_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"gelbridge/_worker/turn.py", "gelbridge/_mapping/to_parts.py", "gelbridge/_worker/writer.py"} <= names
    over = [f"{p.relative_to(ROOT)}:{line} {name} ({lines} lines)"
            for p in files for name, line, lines in oversized(p.read_text(encoding="utf-8"))]
    assert over == []


def _function(name: str, lines: int, indent: str = "") -> str:
    """A function of exactly ``lines`` lines: the def line, a docstring, assignments."""
    body = [f'{indent}    """Doc."""'] + [f"{indent}    x{i} = {i}" for i in range(lines - 2)]
    return "\n".join([f"{indent}def {name}() -> None:", *body]) + "\n"


def test_the_check_finds_a_function_one_line_over() -> None:
    assert oversized(_function("fits", 60)) == []
    assert oversized(_function("over", 61)) == [("over", 1, 61)]
    method = "class Turn:\n    x = 1\n\n" + _function("step", 75, indent="    ").replace("def ", "async def ", 1)
    assert oversized(method) == [("Turn.step", 4, 75)]
    nested = "def outer() -> None:\n" + _function("inner", 62, indent="    ")
    assert oversized(nested) == [("outer", 1, 63), ("outer.inner", 2, 62)]


def test_lint_checks_the_complexity_of_the_same_folders() -> None:
    lint = (ROOT / "scripts" / "lint.sh").read_text(encoding="utf-8")
    line = next(x for x in lint.splitlines() if "--select C901" in x)
    assert "max-complexity = 15" in line and line.endswith(" ".join(CHECKED))
