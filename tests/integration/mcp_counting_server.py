"""A stdio MCP server that counts its executions durably, for "exactly once" tests
across worker processes.

Every execution appends one line ``<tool> <text> <token>`` to ``$COUNT_FILE``
(flushed and fsynced) *before* it answers; ``token`` is unique per execution and is
part of the answer, so a test can tell a reused result from a second run.

- ``lookup(text)``: answers ``looked up <text> #<token>`` (configured auto-run).
- ``note(text)``: answers ``noted <text> #<token>`` (needs approval).
- ``gate(text)``: counts, then blocks until ``$GATE_FILE`` exists (at most 120 s),
  answers ``opened <text> #<token>``: lets a test kill the worker while a call runs.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from mcp.server.mcpserver import MCPServer

app = MCPServer("gelbridge-counting")


def _count(tool: str, text: str) -> str:
    token = uuid.uuid4().hex[:12]
    path = os.environ["COUNT_FILE"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{tool} {text} {token}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return token


@app.tool()
def lookup(text: str) -> str:
    """Look something up (counted)."""
    return f"looked up {text} #{_count('lookup', text)}"


@app.tool()
def note(text: str) -> str:
    """Send a note: a side effect (counted)."""
    return f"noted {text} #{_count('note', text)}"


@app.tool()
async def gate(text: str) -> str:
    """Counted, then waits until the gate file exists (bounded)."""
    token = _count("gate", text)
    gate_file = os.environ["GATE_FILE"]
    deadline = time.monotonic() + 120
    while not os.path.exists(gate_file) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return f"opened {text} #{token}"


if __name__ == "__main__":
    app.run()
