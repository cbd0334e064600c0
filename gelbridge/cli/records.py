"""Offline record commands: ``gelbridge open`` and ``gelbridge convert``.

Shared pieces for every command here: :data:`RecordsArgument`,
:data:`KeyringOption`, :func:`load_keyring`, :func:`open_file` (records of a file with
their sealed fields opened) and :func:`print_json`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gelbridge.cli import app
from gelbridge.config import Settings, load_config
from gelbridge.errors import ConfigError, GelbridgeError, KeyringError, RecordError
from gelbridge.lux import ConversionStatus, Diagnostic, LuxRequest, Options
from gelbridge.mapping import (
    OpenedMessage,
    OpenedRecordCache,
    TurnChoice,
    approval_answers,
    build_request,
    choose_turn,
    repeated_call_parts,
    waiting_calls,
)
from gelbridge.records.constants import (
    CONVERSATION_COLLECTION,
    MESSAGE_COLLECTION,
    SETTINGS_COLLECTION,
    SETTINGS_RKEY,
)
from gelbridge.records.io import RecordEntry, load_records
from gelbridge.records.models import ConversationRecord, MessageRecord, SettingsRecord
from gelbridge.sealing import KEYRING_ENV, CopySources, Keyring, OpenedRecord, content_of, open_record
from gelbridge.thread import Thread, previous_reply_rkey, walk_thread
from gelbridge.tools.approval import resolve_approvals
from gelbridge.tools.loader import builtin_tools
from gelbridge.tools.registry import ToolRegistry

RecordsArgument = Annotated[
    Path,
    typer.Argument(
        help="Records: listRecords JSON, a JSON array of {uri, cid, value}, or a getRepo CAR file.",
        show_default=False,
    ),
]

KeyringOption = Annotated[
    Path | None,
    typer.Option("--keyring", envvar=KEYRING_ENV, help=f"Keyring file (JSON). Default: ${KEYRING_ENV}."),
]

ShowContentOption = Annotated[
    bool,
    typer.Option("--show-content", help="Let diagnostics name what only the opened content tells (unknown "
                                        "part types, mime types, providers of dropped data). Off by default: "
                                        "stderr often ends up in logs."),
]


def load_keyring(path: Path | None) -> Keyring:
    """The keyring at ``path``, or a clear error naming both ways to give one."""
    if path is None:
        raise KeyringError(f"no keyring: pass --keyring FILE or set {KEYRING_ENV}")
    return Keyring.load(path)


def open_file(records: Path, keyring: Keyring | None) -> list[OpenedRecord]:
    """Every record of the file, chat.gel.assistant records parsed and opened.

    A sealed value copied from another record of the same file is reported as such.
    Records of other collections are passed through unchanged.
    """
    entries = load_records(records)
    uris = CopySources((e.uri, e.value) for e in entries)
    out: list[OpenedRecord] = []
    for e in entries:
        if not e.uri.collection.startswith("chat.gel.assistant."):
            out.append(OpenedRecord(e.uri, e.cid, e.value))
            continue
        out.append(open_record(e.uri, e.cid, e.value, keyring=keyring, candidate_uris=uris))
    return out


def print_json(doc: Any) -> None:
    """Pretty JSON on stdout (UTF-8, non-ASCII kept; a document holding a string that is
    not valid Unicode, as a malformed record printed as it is may, is written with
    ``\\u`` escapes instead, which is still JSON)."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(doc, indent=2, ensure_ascii=True)
    sys.stdout.write(text + "\n")


@app.command("open")
def open_command(records: RecordsArgument, keyring: KeyringOption = None) -> None:
    """Print records as JSON with every sealed content/instructions opened.

    Records that cannot be opened are printed as they are, with an "error" field;
    the command then exits non-zero.
    """
    ring = load_keyring(keyring)
    opened = open_file(records, ring)
    out = []
    failed = 0
    for r in opened:
        entry: dict[str, Any] = {"uri": str(r.uri)}
        if r.cid is not None:
            entry["cid"] = r.cid
        entry["value"] = r.opened_value() if r.error is None else _json_form(r.value)
        if r.error is not None:
            failed += 1
            entry["error"] = f"{type(r.error).__name__}: {r.error}"
        out.append(entry)
    print_json({"records": out})
    if failed:
        raise GelbridgeError(
            f"{failed} of {len(opened)} records could not be opened (see their \"error\" fields)"
        )


def _json_form(value: dict[str, Any]) -> dict[str, Any]:
    """A record value as it is, for printing: JSON form, nesting past the limit cut."""
    from gelbridge.records.codec import to_json_form
    from gelbridge.records.nesting import cut

    return to_json_form(cut(value))



# --- convert ---------------------------------------------------------------------------


@dataclass(slots=True)
class ConvertResult:
    """What ``convert`` computed: the request, every diagnostic, and the choice."""

    request: LuxRequest
    diagnostics: list[Diagnostic]
    choice: TurnChoice
    thread: Thread


def convert_file(records: Path, keyring: Keyring, message: str, settings: Settings) -> ConvertResult:
    """The thread of ``message`` in a record file → the Lux IR request for its reply.

    The hook for ``--to <adapter>``: that option takes ``result.request`` and prints
    the provider body the adapter would send instead of the IR itself.
    """
    entries = load_records(records)
    uris = CopySources((e.uri, e.value) for e in entries)
    by_rkey: dict[str, RecordEntry] = {}
    conversations: dict[str, RecordEntry] = {}
    settings_entry: RecordEntry | None = None
    for e in entries:
        if e.uri.collection == MESSAGE_COLLECTION:
            by_rkey[e.uri.rkey] = e
        elif e.uri.collection == CONVERSATION_COLLECTION:
            conversations[e.uri.rkey] = e
        elif e.uri.collection == SETTINGS_COLLECTION and e.uri.rkey == SETTINGS_RKEY:
            settings_entry = e
    if message not in by_rkey:
        raise RecordError(f"message {message} is not in {records}: pass the record key of a user message")
    cache = OpenedRecordCache()

    def lookup(rkey: str) -> MessageRecord | None:
        e = by_rkey.get(rkey)
        return None if e is None else cache.record(str(e.uri), e.cid, e.value)

    thread = walk_thread(message, lookup, max_depth=settings.thread.max_depth)
    opened = []
    for t in thread.entries:
        e = by_rkey[t.rkey]
        content = content_of(t.record.content, uri=e.uri, keyring=keyring, candidate_uris=uris)
        opened.append(OpenedMessage(t.rkey, t.record, content))
    diags: list[Diagnostic] = []

    conv_rec: ConversationRecord | None = None
    conv_instr = None
    ce = conversations.get(thread.conversation)
    if ce is not None:
        conv_rec = ConversationRecord.from_value(ce.value, uri=str(ce.uri))
        if conv_rec.instructions is not None:
            conv_instr = content_of(conv_rec.instructions, uri=ce.uri, keyring=keyring, candidate_uris=uris)
    settings_rec = (SettingsRecord.from_value(settings_entry.value, uri=str(settings_entry.uri))
                    if settings_entry is not None else None)
    msg = thread.message.record
    prev_key = previous_reply_rkey(message, msg)
    in_thread = {t.rkey: t.record for t in thread.entries}
    prev = (in_thread.get(prev_key) or lookup(prev_key)) if prev_key is not None else None
    choice = choose_turn(msg, previous_reply=prev, conversation=conv_rec,
                         settings_record=settings_rec, defaults=settings.defaults)
    if choice.model is None:
        raise ConfigError(
            "no model for this reply: the message, previous reply, conversation and settings "
            "records name none; set [defaults] model in the config (--config)"
        )

    registry = ToolRegistry(builtin_tools(settings.tools))
    tools, unknown = registry.select(choice.tools)
    for name in unknown:
        diags.append(Diagnostic(f"tools.{name}", ConversionStatus.UNSUPPORTED,
                                "tool not offered offline (built-in tools only; MCP servers are not started)"))

    prefix = []
    parent = thread.parent_reply
    if parent is not None:
        parent_parts = opened[-2].content.parts
        waiting = waiting_calls(parent_parts)
        if waiting:
            outcome = resolve_approvals(waiting, approval_answers(opened[-1].content.parts))
            prefix = repeated_call_parts(outcome, {}, parent_parts=parent_parts)
            for ig in outcome.ignored:
                diags.append(Diagnostic(f"{message}.approval", ConversionStatus.DEGRADED,
                                        f"answer for a call that is not waiting ignored ({ig.why})"))

    d = settings.defaults
    built = build_request(
        opened,
        provider=choice.model.provider,
        model=choice.model.id,
        choice=choice,
        instructions=d.instructions,
        conversation_instructions=conv_instr,
        tool_specs=[t.spec() for t in tools],
        options=Options(stream=True, max_output_tokens=d.max_output_tokens, temperature=d.temperature),
        reply_prefix=prefix,
    )
    return ConvertResult(built.value, diags + built.diagnostics, choice, thread)


@app.command("convert")
def convert_command(
    records: RecordsArgument,
    message: Annotated[str, typer.Option("--message", help="Record key of the user message to answer.")],
    keyring: KeyringOption = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="Config file (TOML): defaults, thread depth limit, built-in tools.")
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="Adapter name: print the provider request body it would send (no network)."),
    ] = None,
    show_content: ShowContentOption = False,
) -> None:
    """Print the Lux IR request gelbridge would send for the reply to a message.

    Walks the message's thread, opens it, chooses model/tools/effort (message,
    previous reply, conversation and settings records of the file, then the config's defaults section),
    and prints the request JSON on stdout; diagnostics go to stderr, one per line
    (naming nothing from the sealed content unless --show-content).
    Blobs are not in record files: images and extracted file text are reported.
    Approved calls are not run offline; they are answered as not run.
    With --to ADAPTER, prints instead the provider body that adapter's script builds.
    """
    settings = load_config(config)
    ring = load_keyring(keyring)
    result = convert_file(records, ring, message, settings)
    if to is not None:
        from gelbridge.cli.reply import print_provider_body

        print_provider_body(to, result, settings, show_content)
        return
    print_json(result.request.to_json())
    for diag in result.diagnostics:
        sys.stderr.write(diag.describe(show_content) + "\n")
