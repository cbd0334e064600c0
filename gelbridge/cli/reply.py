"""``gelbridge reply``: one whole turn offline, from a record file to the sealed reply record.

Also the ``--to`` output of ``gelbridge convert`` (:func:`print_provider_body`).

``reply`` walks and maps the thread exactly like ``convert``, calls the model through
``ModelClient`` (the provider of the chosen modelRef), turns the response into parts,
seals them with the user message's keyId for ``at://<did>/chat.gel.assistant.message/<K>.r<n>``
and prints the record value as it would be written. It writes nothing anywhere.
Tools are never run offline: a call that needs approval is left ``pending`` (status
``awaitingApproval``, as the worker writes it); a call that needs none gets an error
result "not run" (the worker would run it and continue the loop).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gelbridge.cli import app
from gelbridge.cli.records import ShowContentOption
from gelbridge.errors import AdapterError, AdapterLoadError, GelbridgeError, ProviderError

if TYPE_CHECKING:
    from gelbridge.cli.records import ConvertResult
    from gelbridge.config import Settings

NOT_RUN = "not run: 'gelbridge reply' runs no tools offline (the worker runs this call)"


def print_provider_body(adapter_name: str, result: ConvertResult, settings: Settings,
                        show_content: bool = False) -> None:
    """Print the provider request body adapter ``adapter_name`` builds for ``result``
    (stdout, pretty JSON when it is JSON) and the diagnostics (stderr)."""
    import json

    from gelbridge.adapters.client import provider_body
    from gelbridge.adapters.registry import registry_from_settings

    registry = registry_from_settings(settings)
    adapter = registry.get(adapter_name)
    assert result.choice.model is not None
    try:
        conv = provider_body(adapter, result.request, provider=result.choice.model.provider,
                             model=result.request.model)
    except AdapterError as e:
        if show_content or isinstance(e, AdapterLoadError):
            raise
        # a script's runtime error may quote the request (sealed content)
        raise GelbridgeError(f"adapter {adapter_name!r} failed on this request ({e.kind}); "
                             "add --show-content to see its message") from None
    try:
        text = json.dumps(json.loads(conv.value), indent=2, ensure_ascii=False)
    except ValueError:
        text = conv.value
    sys.stdout.write(text + "\n")
    for d in [*result.diagnostics, *conv.diagnostics]:
        sys.stderr.write(d.describe(show_content) + "\n")


def _now() -> str:
    from gelbridge.records import now_datetime

    return now_datetime()


@app.command("reply")
def reply_command(
    records: Annotated[Path, typer.Argument(help="Records: listRecords JSON, a JSON array of {uri, cid, value}, "
                                                 "or a getRepo CAR file.", show_default=False)],
    message: Annotated[str, typer.Option("--message", help="Record key of the user message to answer.")],
    keyring: Annotated[Path | None, typer.Option("--keyring", envvar="GELBRIDGE_KEYRING",
                                                 help="Keyring file (JSON).")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Config file (TOML) with [providers].")] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Stream the model's answer.")] = True,
    show_content: ShowContentOption = False,
) -> None:
    """Answer one message offline: print the sealed reply record JSON on stdout.

    Calls the model of the chosen modelRef through its adapter ([providers] in the
    config), seals the reply with the user message's keyId and prints the record as
    it would be written (nothing is written to any PDS). A summary (model, tokens,
    timings, diagnostics; never content unless --show-content) goes to stderr. Tools are
    not run offline.
    """
    from gelbridge.cli.records import convert_file, load_keyring, print_json
    from gelbridge.config import load_config

    settings = load_config(config)
    ring = load_keyring(keyring)
    result = convert_file(records, ring, message, settings)
    record, summary, failed = asyncio.run(_turn(records, ring, message, settings, result, stream, show_content))
    print_json(record)
    sys.stderr.write(summary)
    if failed:
        raise GelbridgeError(failed)


async def _turn(records: Path, ring: Any, message: str, settings: Settings, result: ConvertResult,
                stream: bool, show_content: bool = False) -> tuple[dict[str, Any], str, str | None]:
    from gelbridge.adapters.client import ModelClient
    from gelbridge.lux import LuxResponse
    from gelbridge.mapping import (
        approval_answers,
        call_ids_in,
        repeated_call_parts,
        response_to_parts,
        waiting_calls,
    )
    from gelbridge.records import (
        MESSAGE_COLLECTION,
        AtUri,
        EncryptedContent,
        MessageRecord,
        ModelRef,
        PlainContent,
        ReplyError,
        ToolResultPart,
        reply_rkey,
    )
    from gelbridge.records.io import load_records
    from gelbridge.sealing import CopySources, content_of, seal_content
    from gelbridge.tools.approval import resolve_approvals
    from gelbridge.tools.loader import builtin_tools
    from gelbridge.tools.registry import ToolRegistry, needs_approval
    from gelbridge.worker.decide import error_message, reply_error_kind

    assert result.choice.model is not None
    provider, model = result.choice.model.provider, result.choice.model.id
    entries = {e.uri.rkey: e for e in load_records(records) if e.uri.collection == MESSAGE_COLLECTION}
    uris = CopySources((e.uri, e.value) for e in entries.values())
    msg_entry = entries[message]
    msg = result.thread.message.record
    attempt = msg.generation.attempt if msg.generation is not None else 0
    rkey = reply_rkey(message, attempt)
    uri = AtUri(msg_entry.uri.did, MESSAGE_COLLECTION, rkey)

    # what the thread already holds: call ids (unique per conversation), and the
    # repeated approved/denied calls that start this reply (as convert computed them)
    opened = {t.rkey: content_of(t.record.content, uri=entries[t.rkey].uri, keyring=ring,
                                 candidate_uris=uris) for t in result.thread.entries}
    used: set[str] = set()
    for c in opened.values():
        used |= call_ids_in(c.parts)
    prefix: list[Any] = []
    parent = result.thread.parent_reply
    if parent is not None:
        waiting = waiting_calls(opened[parent.rkey].parts)
        if waiting:
            outcome = resolve_approvals(waiting, approval_answers(opened[message].parts))
            prefix = repeated_call_parts(outcome, {}, parent_parts=opened[parent.rkey].parts)
            for p in list(prefix):
                if p.type.endswith("#toolCallPart") and p.approval == "approved":
                    prefix.insert(prefix.index(p) + 1, ToolResultPart(call_id=p.call_id, output=NOT_RUN,
                                                                      is_error=True))
    used |= call_ids_in(prefix)

    tools = ToolRegistry(builtin_tools(settings.tools))
    created = _now()
    lines: list[str] = [f"model: {provider}/{model} (adapter {settings.providers[provider].adapter if provider in settings.providers else '?'})\n"]
    diags = list(result.diagnostics)
    failed: str | None = None
    response: LuxResponse | None = None
    error: ReplyError | None = None
    async with ModelClient(settings) as client:
        try:
            res = await client.complete(result.request, provider=provider, stream=stream)
            response = res.response
            diags += res.diagnostics
            t = res.timing
            ttfb = f"{t.ttfb_ms:.1f}" if t.ttfb_ms is not None else "-"
            lines.append(f"timing: total {t.total_ms:.1f} ms, first byte {ttfb} ms, adapter {t.adapter_ms:.2f} ms, "
                         f"{t.chunks} chunks, {t.attempts} attempt(s)\n")
        except (ProviderError, AdapterError) as e:
            response = getattr(e, "partial", None)
            diags += getattr(e, "diagnostics", [])
            # the record gets the worker's content-free text: a provider may echo the prompt
            kind = reply_error_kind(e.kind)
            error = ReplyError(kind=kind, message=error_message(kind, status=getattr(e, "status", None)))
            failed = f"the model call failed ({kind}); the printed record is the error reply"

    parts: list[Any] = list(prefix)
    status = "complete"
    finish = None
    usage = None
    if response is not None:
        draft = response_to_parts(response, provider=provider, model=model,
                                  needs_approval=lambda name: needs_approval(name, tools),
                                  reply_rkey=rkey, used_call_ids=used)
        diags += draft.diagnostics
        parts += draft.parts
        for call in draft.runnable_calls:
            parts.insert(parts.index(call) + 1, ToolResultPart(call_id=call.call_id, output=NOT_RUN,
                                                               is_error=True))
        if draft.runnable_calls:
            lines.append(f"tools: {len(draft.runnable_calls)} call(s) not run offline\n")
        finish, usage = draft.finish_reason, draft.usage
        if draft.awaiting_approval:
            status = "awaitingApproval"
            lines.append(f"tools: {len(draft.pending_calls)} call(s) wait for approval\n")
    if error is not None:
        status = "error"
        finish = "error"
    content = PlainContent(parts=parts)
    if isinstance(msg.content, EncryptedContent):
        sealed: Any = seal_content(content, uri=uri, key_id=msg.content.key_id, keyring=ring)
    else:
        sealed = content
    rec = MessageRecord(
        conversation=msg.conversation, role="assistant", parent=message, content=sealed,
        model=ModelRef(provider=provider, id=model), effort=result.choice.effort, usage=usage,
        status=status, finish_reason=finish, error=error, created_at=created, updated_at=_now(),
    )
    if usage is not None:
        lines.append(f"tokens: input {usage.input_tokens}, output {usage.output_tokens}"
                     f"{f', reasoning {usage.reasoning_tokens}' if usage.reasoning_tokens is not None else ''}\n")
    lines.append(f"reply: {uri} status {status}, finish {finish}, {len(parts)} part(s)\n")
    lines += [f"diagnostic: {d.describe(show_content)}\n" for d in diags]
    if error is not None:
        lines.append(f"error: {error.kind}: {error.message}\n")
    return rec.to_value(), "".join(lines), failed
