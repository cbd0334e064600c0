"""A real MCP server for the tests: stdio by default, streamable HTTP with --http PORT."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

app = MCPServer("gelbridge-test")


@app.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@app.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep for a while, then answer."""
    await asyncio.sleep(seconds)
    return "finally"


@app.tool()
def fail() -> str:
    """Always raise."""
    raise ValueError("this tool always fails")


@app.tool()
def huge(n: int) -> str:
    """Return n characters."""
    return "y" * n + "END"


@app.tool()
def crash() -> str:
    """Kill the server process."""
    os._exit(7)


@app.tool(name="weird.name/with spaces")
def weird() -> str:
    """A tool whose name is not provider-safe."""
    return "weird ok"


@app.tool()
def pid() -> int:
    """The server's process id (to see restarts)."""
    return os.getpid()


@app.tool()
def env(name: str) -> str:
    """An environment variable of the server, or '<unset>'."""
    return os.environ.get(name, "<unset>")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
