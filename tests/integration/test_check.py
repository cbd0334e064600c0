"""``gelbridge check`` and the same checks in ``gelbridge run``, against the real local
PDS: each operator mistake gives its own clear line and exit code 1, no traceback, and
nothing is written to the PDS; a good configuration logs in and says ok."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds, free_port
from gelbridge._records import MESSAGE_COLLECTION
from gelbridge._sealing import Keyring

from .conftest import PASSWORD_ENV, App, make_settings, running_worker
from .worker_proc import write_config

pytestmark = [pytest.mark.pds, pytest.mark.timeout(300)]


def gelbridge(*args: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GELBRIDGE_")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "gelbridge", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=full, stdin=subprocess.DEVNULL)


CLOSED = free_port()  # nothing listens there
MISTAKES = {
    "unknown section": ("\n[wacth]\nsource = \"poll\"\n", "[wacth]: unknown section; did you mean [watch]?"),
    "typo in [tools]": ("\n[tools]\nmax_step = 3\n", "[tools] max_step: unknown key; did you mean [tools] max_steps?"),
    "unknown adapter": ("\n[providers.other]\nadapter = \"opnai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
                        "[providers.other] adapter = 'opnai': no such adapter"),
    "api key variable unset": ("\n[providers.other]\nadapter = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n"
                               "api_key_env = \"GELBRIDGE_TEST_UNSET_KEY\"\n",
                               "[providers.other] api_key_env: $GELBRIDGE_TEST_UNSET_KEY is not set"),
    "provider that nothing answers for": ("\n[providers.other]\nadapter = \"anthropic\"\n"
                                          f"base_url = \"http://127.0.0.1:{CLOSED}\"\n",
                                          f"[providers.other] base_url: connection refused at 127.0.0.1:{CLOSED}"),
    "MCP server that does not start": ("\n[mcp.servers.broken]\ncommand = [\"/nonexistent/server\"]\n"
                                       "startup_timeout = 5\n",
                                       "[mcp.servers.broken]: the server did not start or lists no tools"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
async def test_each_operator_mistake_stops_check_and_run_with_its_own_line_and_writes_nothing(
    mistake: str, dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    extra, expected = MISTAKES[mistake]
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0], extra=extra)
    env = {PASSWORD_ENV: pds_account.app_password}
    for command in ("check", "run"):
        r = gelbridge(command, "--config", str(cfg), cwd=tmp_path, env=env)
        assert r.returncode == 1, (command, r.stdout, r.stderr)
        assert expected in r.stderr, (command, r.stderr)
        assert "Traceback" not in r.stderr and "ready" not in r.stdout
    assert [x async for x in app.pds.iter_records(MESSAGE_COLLECTION)] == []
    assert not (tmp_path / "state").exists()  # run stopped before opening its state


async def test_wrong_defaults_keyring_and_password_are_each_named(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0],
                       tools=["current_time", "mcp_nowhere_tool"])
    text = cfg.read_text().replace('provider = "local"', 'provider = "elsewhere"')
    cfg.write_text(text)
    Keyring().save(tmp_path / "keyring.json")  # readable, but holds no key
    r = gelbridge("check", "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: "not-the-password"})
    assert r.returncode == 1, r.stderr
    for line in ("[defaults] model: provider 'elsewhere' is not configured in [providers] (configured: local)",
                 "[defaults] tools: 'mcp_nowhere_tool' is not a tool here",
                 f"[keyring] path: {tmp_path / 'keyring.json'} holds no key",
                 f"refused the login of {pds_account.handle}"):
        assert line in r.stderr, (line, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("error: ") == 4
    assert r.stderr.endswith(f"\ncheck: 4 problems in {cfg}\n")


async def test_a_good_configuration_checks_ok_with_a_summary(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0], tools=["current_time"])
    r = gelbridge("check", "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: pds_account.app_password})
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("check: ok")
    assert f"logged in as {pds_account.handle}" in r.stdout and "local (openai)" in r.stdout
    assert "1 key(s)" in r.stdout
    # the provider was asked: it answers at base_url; the echo server lists 'echo', not the
    # default 'echo-1' it also answers, which an OpenAI-compatible host may do: a warning
    assert f"probe      local (openai): GET {model_server.url}/v1/models answered; no key configured" in r.stdout
    assert "warning: [providers.local] [defaults] model 'echo-1' is not among the 1 models" in r.stderr




async def test_a_main_password_checks_ok_with_a_warning_to_make_an_app_password(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    main = gelbridge("check", "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: pds_account.password})
    assert main.returncode == 0 and main.stdout.rstrip().endswith("check: ok"), main.stderr
    def account_warnings(stderr: str) -> list[str]:  # (the echo model's id is a probe warning of its own)
        return [x for x in stderr.splitlines() if x.startswith("warning: [account]")]

    assert account_warnings(main.stderr) == [
        f"warning: [account] password_env: ${PASSWORD_ENV} holds the account's main password: make an app password "
        "(your PDS account's settings, App Passwords; Bluesky: Settings > Privacy and security > App passwords) and "
        f"put it in ${PASSWORD_ENV}"]
    app = gelbridge("check", "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: pds_account.app_password})
    assert app.returncode == 0 and account_warnings(app.stderr) == [], app.stderr


async def test_a_bad_password_is_one_error_and_run_opens_no_state(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    refused = (f"error: [account]: the PDS at {dev_pds.pds_url} refused the login of {pds_account.handle}: check "
               f"the identifier and the app password in ${PASSWORD_ENV}\n")
    for command in ("check", "run"):
        r = gelbridge(command, "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: "not-the-password"})
        assert r.returncode == 1 and "ready" not in r.stdout, (command, r.stdout)
        assert r.stderr.endswith(refused) and r.stderr.count("error: ") == 1, (command, r.stderr)
        assert not (tmp_path / "state").exists(), command  # no SQLite file before the checks pass


async def test_a_wrong_password_is_found_even_when_the_state_holds_a_valid_session(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], model_server: ModelServer,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, dev_pds.pds_url, pds_account, model_server.url, keyring[0])
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)
    async with running_worker(settings, pds_account, keyring[0]):
        pass  # logged in: the session is saved in the state, and still valid
    good = gelbridge("check", "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: pds_account.app_password})
    assert good.returncode == 0, good.stderr
    for command in ("run", "check"):  # run would resume the saved session and serve until it expires
        r = gelbridge(command, "--config", str(cfg), cwd=tmp_path, env={PASSWORD_ENV: "not-the-password"}, timeout=60)
        assert r.returncode == 1 and "ready" not in r.stdout, (command, r.stdout, r.stderr)
        assert r.stderr.count("error: ") == 1 and f"refused the login of {pds_account.handle}" in r.stderr, r.stderr
