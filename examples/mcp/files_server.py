"""A small read-only MCP server over one folder: the README's `[mcp.servers.files]`.

    .venv/bin/python examples/mcp/files_server.py FOLDER      # stdio, as gelbridge starts it

Two tools, which gelbridge offers as `mcp_files_list_files` and `mcp_files_read_file`:
list the files below FOLDER, and read one of them as text. Nothing outside FOLDER can be
named (`..` and links out of it are refused) and nothing is ever written. Any stdio MCP
server works the same way in `[mcp.servers.<name>] command` (docs/tools.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

MAX_FILES = 500
MAX_BYTES = 200_000

app = MCPServer("gelbridge-example-files")
ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()


def _inside(relative: str) -> Path:
    path = (ROOT / relative).resolve()
    if path != ROOT and ROOT not in path.parents:
        raise ValueError(f"{relative!r} is outside the served folder")
    return path


@app.tool()
def list_files(folder: str = ".") -> list[str]:
    """The files below a folder of the served folder (paths relative to it, at most 500)."""
    base = _inside(folder)
    if not base.is_dir():
        raise ValueError(f"{folder!r} is not a folder")
    found = sorted(str(p.relative_to(ROOT)) for p in base.rglob("*") if p.is_file() and ROOT in p.resolve().parents)
    return found[:MAX_FILES]


@app.tool()
def read_file(path: str) -> str:
    """One file of the served folder as UTF-8 text (at most 200,000 bytes)."""
    file = _inside(path)
    if not file.is_file():
        raise ValueError(f"{path!r} is not a file")
    with file.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    text = data[:MAX_BYTES].decode("utf-8", errors="replace")
    return text + ("\n[cut at 200,000 bytes]" if len(data) > MAX_BYTES else "")


if __name__ == "__main__":
    app.run()
