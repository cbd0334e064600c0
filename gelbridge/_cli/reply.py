"""``gelbridge reply``: one whole turn offline, from a record file to the sealed reply record.

``reply`` runs the worker's own turn on the record file (``gelbridge._worker.offline``):
the same thread walk, choice, approvals and reply record as ``gelbridge run``, calling
the model through ``ModelClient`` (the provider of the chosen modelRef), and prints the
record value the worker would write for ``at://<did>/chat.gel.assistant.message/<K>.r<n>``.
It writes nothing anywhere. Tools are never run offline: a call that needs approval is
left ``pending`` (status ``awaitingApproval``); a call that needs none gets the error
result "not run" and the loop goes on, as after a failed tool.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gelbridge._cli._app import app
from gelbridge._cli.records import BridgeKeyOption, KeyringOption, RecordsArgument, ShowContentOption
from gelbridge._errors import GelbridgeError
from gelbridge._terminal import safe_line

if TYPE_CHECKING:
    from gelbridge._config import Settings


@app.command("reply")
def reply_command(
    records: RecordsArgument,
    message: Annotated[str, typer.Option("--message", help="Record key of the user message to answer.")],
    keyring: KeyringOption = None,
    bridge_key: BridgeKeyOption = None,
    config: Annotated[Path | None, typer.Option("--config", help="Config file (TOML) with [providers].")] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Stream the model's answer.")] = True,
    show_content: ShowContentOption = False,
) -> None:
    """Answer one message offline: print the sealed reply record JSON on stdout.

    Runs the worker's own turn on the file: calls the model of the chosen modelRef
    through its adapter ([providers] in the config), seals the reply with the user
    message's keyId and prints the record as gelbridge run would write it (nothing is
    written to any PDS). A summary (model, tokens, timings, diagnostics; never content
    unless --show-content) goes to stderr. Tools are not run offline.
    """
    import asyncio

    from gelbridge._cli.records import load_keys, print_json
    from gelbridge._config import load_config

    settings = load_config(config)
    ring = load_keys(records, keyring, bridge_key, settings)
    record, summary, failed = asyncio.run(_reply(records, ring, message, settings, stream, show_content))
    print_json(record)
    sys.stderr.write(summary)
    if failed:
        raise GelbridgeError(failed)


async def _reply(records: Path, ring: Any, message: str, settings: Settings, stream: bool,
                 show_content: bool) -> tuple[dict[str, Any], str, str | None]:
    from gelbridge._adapters.client import ModelClient
    from gelbridge._cli.records import _why_no_request
    from gelbridge._worker.offline import run_offline

    async with ModelClient(settings) as client:
        turn = await run_offline(records, message, ring, settings, model=client, stream=stream)
    if turn.reply is None:
        raise _why_no_request(records, message, turn)
    value = turn.reply
    lines: list[str] = []
    model = value.get("model") or {}
    if model:
        provider = model.get("provider")
        adapter = settings.providers[provider].adapter if provider in settings.providers else "?"
        lines.append(f"model: {provider}/{model.get('id')} (adapter {adapter})")
    rep = turn.report
    if rep is not None:
        t = rep.timing
        lines.append(f"timing: model {t.model_ms:.1f} ms, bridge {t.bridge_ms:.1f} ms, {rep.steps} step(s)")
    usage = value.get("usage")
    if usage:
        reasoning = usage.get("reasoningTokens")
        lines.append(f"tokens: input {usage.get('inputTokens')}, output {usage.get('outputTokens')}"
                     f"{f', reasoning {reasoning}' if reasoning is not None else ''}")
    lines.append(f"reply: at://{turn.did}/chat.gel.assistant.message/{turn.reply_rkey} status {value.get('status')}, "
                 f"finish {value.get('finishReason')}")
    if rep is not None and rep.steps > 1:
        lines.append("tools: calls the worker would run were answered \"not run\" offline")
    lines += [f"diagnostic: {d.describe(show_content)}" for d in turn.diagnostics]
    failed = None
    err = value.get("error")
    if value.get("status") == "error" and err:
        lines.append(f"error: {err.get('kind')}: {err.get('message')}")
        failed = f"the turn failed ({err.get('kind')}); the printed record is the error reply"
    # the model id and the rest come from the records (anyone who can write them): shown, never obeyed
    return value, "".join(safe_line(line) + "\n" for line in lines), failed
