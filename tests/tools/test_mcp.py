"""MCP tools against a real MCP server (tests/tools/mcp_test_server.py), stdio and HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gelbridge._config import Settings
from gelbridge._errors import ConfigError
from gelbridge._tools import ToolCall, ToolRegistry, execute_calls, load_tool_registry, mcp_tool_name

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))
PYTHON = sys.executable


def settings(servers: dict[str, Any], tools: dict[str, Any] | None = None) -> Settings:
    return Settings.model_validate({"tools": tools or {}, "mcp": {"servers": servers}})


@pytest.fixture
def errlog(tmp_path: Path):
    with open(tmp_path / "mcp-stderr.log", "w") as f:
        yield f


# One server process for the tests that share it (starting one costs seconds on a busy
# machine); the crash test restarts it, which the others do not mind.
shared = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def registry(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ToolRegistry]:
    errlog = open(tmp_path_factory.mktemp("mcp") / "stderr.log", "w")
    s = settings(
        {
            "test": {
                "command": [PYTHON, SERVER],
                "env": {"FOO": "bar"},
                "env_passthrough": ["PASSME"],
                "tools": {"add": {"approval": "never"}, "pid": {"approval": "never"}},
            }
        },
        {"call_timeout": 10},
    )
    reg = await load_tool_registry(s, environ={"PASSME": "passed", "SECRET_KEY": "s3cret"}, errlog=errlog)
    try:
        yield reg
    finally:
        await asyncio.wait_for(reg.aclose(), 20)
        errlog.close()


async def run(reg: ToolRegistry, tool: str, args: dict[str, Any], *, timeout: float = 10, max_chars: int = 10000):
    (out,) = await execute_calls(
        [ToolCall("c1", tool, json.dumps(args), approved=True)], reg, timeout=timeout, max_output_chars=max_chars
    )
    return out


@shared
async def test_tools_are_listed_named_and_configured(registry: ToolRegistry) -> None:
    names = set(registry.names())
    expected = {f"mcp_test_{n}" for n in ("add", "echo", "slow", "fail", "huge", "crash", "pid", "env")}
    assert expected <= names
    assert "mcp_test_weird_name_with_spaces" in names
    add = registry.get("mcp_test_add")
    echo = registry.get("mcp_test_echo")
    assert add is not None and echo is not None
    assert add.approval == "never" and echo.approval == "always"  # MCP default: always
    assert add.source == f"{PYTHON} {SERVER}"
    assert add.parameters["required"] == ["a", "b"] and add.description == "Add two numbers."
    assert {"current_time", "fetch_url"} <= names  # built-ins next to MCP tools


@shared
async def test_calls_return_results_and_errors(registry: ToolRegistry) -> None:
    assert (await run(registry, "mcp_test_add", {"a": 2, "b": 40})).output == "42.0"
    echoed = await run(registry, "mcp_test_echo", {"text": "héllo"})
    assert (echoed.output, echoed.is_error) == ("héllo", False)
    assert (await run(registry, "mcp_test_weird_name_with_spaces", {})).output == "weird ok"
    failed = await run(registry, "mcp_test_fail", {})
    assert failed.is_error
    bad = await run(registry, "mcp_test_add", {"a": 1})
    assert bad.is_error and "Missing required argument(s): b" in bad.output


@shared
async def test_unapproved_call_to_an_approval_tool_is_not_run(registry: ToolRegistry) -> None:
    (out,) = await execute_calls(
        [ToolCall("c", "mcp_test_crash", "{}")], registry, timeout=5, max_output_chars=1000
    )
    assert out.is_error and "approval" in out.output
    assert (await run(registry, "mcp_test_echo", {"text": "still alive"})).output == "still alive"


@shared
async def test_a_slow_tool_times_out_and_the_server_keeps_working(registry: ToolRegistry) -> None:
    start = time.monotonic()
    out = await run(registry, "mcp_test_slow", {"seconds": 60}, timeout=0.5)
    assert out.is_error and "0.5 seconds" in out.output
    assert time.monotonic() - start < 5
    assert (await run(registry, "mcp_test_echo", {"text": "next"})).output == "next"


@shared
async def test_a_crashed_server_gives_an_error_and_restarts_on_next_call(registry: ToolRegistry) -> None:
    pid_before = int((await run(registry, "mcp_test_pid", {})).output)
    start = time.monotonic()
    crashed = await run(registry, "mcp_test_crash", {})
    assert crashed.is_error and "failed during the call" in crashed.output
    assert time.monotonic() - start < 5
    pid_after = int((await run(registry, "mcp_test_pid", {})).output)
    assert pid_after != pid_before
    assert (await run(registry, "mcp_test_add", {"a": 1, "b": 1})).output == "2.0"


@shared
async def test_huge_output_is_summarised_with_the_full_text_aside(registry: ToolRegistry) -> None:
    out = await run(registry, "mcp_test_huge", {"n": 200_000}, max_chars=2000)
    assert not out.is_error and len(out.output) <= 2000 and "truncated" in out.output
    assert out.long_output is not None and len(out.long_output) == 200_003 and out.long_output.endswith("END")


@shared
async def test_server_sees_only_configured_environment(registry: ToolRegistry) -> None:
    assert (await run(registry, "mcp_test_env", {"name": "FOO"})).output == "bar"
    assert (await run(registry, "mcp_test_env", {"name": "PASSME"})).output == "passed"
    assert (await run(registry, "mcp_test_env", {"name": "SECRET_KEY"})).output == "<unset>"


@shared
async def test_parallel_calls_to_one_server_overlap(registry: ToolRegistry) -> None:
    # one after another they take at least 4 x 2 s; in parallel about 2 s. The bound leaves a
    # loaded 2-core CI machine 4 s of overhead and still fails for calls run one by one.
    calls = [ToolCall(str(i), "mcp_test_slow", json.dumps({"seconds": 2.0}), approved=True) for i in range(4)]
    start = time.monotonic()
    out = await execute_calls(calls, registry, timeout=20, max_output_chars=100)
    elapsed = time.monotonic() - start
    assert [o.output for o in out] == ["finally"] * 4
    assert elapsed < 6.0, f"4 x 2 s took {elapsed:.2f} s: the calls did not overlap"


async def test_servers_that_fail_or_hang_at_start_are_left_out(errlog, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="gelbridge.tools")
    s = settings(
        {
            "exits": {"command": [PYTHON, "-c", "import sys; sys.exit(3)"], "startup_timeout": 10},
            "hangs": {"command": [PYTHON, "-c", "import time; time.sleep(120)"], "startup_timeout": 1},
            "missing": {"command": ["/nonexistent/gelbridge-mcp-server"], "startup_timeout": 5},
        }
    )
    start = time.monotonic()
    reg = await load_tool_registry(s, errlog=errlog)
    try:
        assert time.monotonic() - start < 15
        assert not [n for n in reg.names() if n.startswith("mcp_")]
        assert reg.select(["mcp_exits_x", "current_time"])[1] == ["mcp_exits_x"]
        logged = caplog.text
        assert "exits" in logged and "hangs" in logged and "missing" in logged
    finally:
        await asyncio.wait_for(reg.aclose(), 20)


def test_bad_mcp_configuration_is_a_config_error() -> None:
    from gelbridge._tools.config import mcp_servers

    with pytest.raises(ConfigError, match=r"\[mcp.servers.both\]"):
        mcp_servers({"servers": {"both": {"command": ["x"], "url": "http://127.0.0.1/"}}})
    with pytest.raises(ConfigError, match="neither|exactly one"):
        mcp_servers({"servers": {"neither": {}}})
    with pytest.raises(ConfigError, match="approval"):
        mcp_servers({"servers": {"s": {"command": ["x"], "approval": "sometimes"}}})
    with pytest.raises(ConfigError):
        mcp_servers({"server": {}})


def test_generated_names_are_provider_safe_and_stable() -> None:
    assert mcp_tool_name("files", "read_file") == "mcp_files_read_file"
    assert mcp_tool_name("my server", "a.b/c") == "mcp_my_server_a_b_c"
    long = mcp_tool_name("s" * 40, "t" * 40)
    assert len(long) <= 64 and long == mcp_tool_name("s" * 40, "t" * 40)
    clash = mcp_tool_name("x", "a/b", taken={"mcp_x_a_b"})
    assert clash != "mcp_x_a_b" and len(clash) <= 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http_server(tmp_path: Path):
    port = _free_port()
    log = open(tmp_path / "http-server.log", "w")
    proc = subprocess.Popen([PYTHON, SERVER, "--http", str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("HTTP MCP server exited")
                time.sleep(0.1)
        else:
            pytest.fail("HTTP MCP server did not listen within 20 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


async def test_streamable_http_server(http_server: str) -> None:
    s = settings({"remote": {"url": http_server, "approval": "never", "headers_env": {"X-Token": "TOKEN_VAR"}}})
    reg = await load_tool_registry(s, environ={"TOKEN_VAR": "t0k"})
    try:
        tool = reg.get("mcp_remote_add")
        assert tool is not None and tool.source == http_server and tool.approval == "never"
        assert (await run(reg, "mcp_remote_add", {"a": 3, "b": 4})).output == "7.0"
        slow = await run(reg, "mcp_remote_slow", {"seconds": 30}, timeout=0.5)
        assert slow.is_error
    finally:
        await asyncio.wait_for(reg.aclose(), 20)


async def test_http_server_that_is_down_is_left_out() -> None:
    s = settings({"down": {"url": f"http://127.0.0.1:{_free_port()}/mcp", "startup_timeout": 5}})
    start = time.monotonic()
    reg = await load_tool_registry(s)
    try:
        assert not [n for n in reg.names() if n.startswith("mcp_")]
        assert time.monotonic() - start < 10
    finally:
        await asyncio.wait_for(reg.aclose(), 20)
