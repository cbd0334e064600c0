"""``gelbridge dev model`` as a user runs it: a subprocess that prints one JSON ready
line (and the TOML to paste on stderr), serves the tool mode until SIGTERM, and says
in one line what to do when its port is taken; ``scripts/run_model_server.py`` is its
echo-mode alias."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from gelbridge._dev.pds import free_port
from testkit.processes import read_line

pytestmark = pytest.mark.timeout(120)

GELBRIDGE = [sys.executable, "-m", "gelbridge"]
ALIAS = [sys.executable, str(Path(__file__).resolve().parents[2] / "scripts" / "run_model_server.py")]


@contextmanager
def _running(cmd: list[str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    err = tmp_path / "stderr.txt"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(err, "w"), stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        line = read_line(proc, timeout=60)
        assert line, f"no ready line; stderr: {err.read_text()[-2000:]}"
        yield proc, json.loads(line)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_dev_model_prints_its_config_serves_tool_calls_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    with _running([*GELBRIDGE, "dev", "model", "--port", str(port), "--api-key", "sk-dev"], tmp_path) as (proc, ready):
        url = f"http://127.0.0.1:{port}"
        assert ready["url"] == url and ready["mode"] == "tools"
        assert ready["providers"] == {
            "local": {"adapter": "openai", "base_url": f"{url}/v1", "api_key_env": "GELBRIDGE_DEV_MODEL_KEY"},
            "local-responses": {"adapter": "openai-responses", "base_url": f"{url}/v1",
                                "api_key_env": "GELBRIDGE_DEV_MODEL_KEY"},
            "local-anthropic": {"adapter": "anthropic", "base_url": url, "api_key_env": "GELBRIDGE_DEV_MODEL_KEY"},
            "local-gemini": {"adapter": "gemini", "base_url": f"{url}/v1beta", "api_key_env": "GELBRIDGE_DEV_MODEL_KEY"},
            "local-ollama": {"adapter": "ollama", "base_url": url, "api_key_env": "GELBRIDGE_DEV_MODEL_KEY"},
        }
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-dev", max_retries=0)
        r = client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "call current_time timezone=UTC"}],
            tools=[{"type": "function", "function": {"name": "current_time", "parameters": {"type": "object"}}}])
        [call] = r.choices[0].message.tool_calls or []
        assert (call.function.name, json.loads(call.function.arguments)) == ("current_time", {"timezone": "UTC"})
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""  # exactly one line
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/api/version", timeout=2)
    err = (tmp_path / "stderr.txt").read_text()
    pasted = err[err.index("For gelbridge.toml:") + len("For gelbridge.toml:"):err.index("and in the shell")]
    toml = tomllib.loads(pasted)  # the block a user pastes is TOML as printed
    assert toml["defaults"]["tools"] == ["current_time", "fetch_url"]
    assert toml["providers"] == ready["providers"]
    assert "export GELBRIDGE_DEV_MODEL_KEY=sk-dev" in err and "Traceback" not in err


def test_a_taken_port_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([*GELBRIDGE, "dev", "model", "--port", str(port)], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port} (Address already in use): another 'gelbridge dev model' may be "
        "running; pass --port 0 for a free port"]


def test_the_script_alias_serves_the_echo_mode(tmp_path: Path) -> None:
    with _running([*ALIAS, "--chunk-size", "3"], tmp_path) as (proc, ready):
        assert ready["mode"] == "echo"
        client = openai.OpenAI(base_url=f"{ready['url']}/v1", api_key="any", max_retries=0)
        chunks = list(client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "call current_time"}], stream=True,
            tools=[{"type": "function", "function": {"name": "current_time"}}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "You said: call current_time" and len(chunks) > len(text) // 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
