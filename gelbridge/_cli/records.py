"""Offline record commands: ``gelbridge open`` and ``gelbridge convert`` (with ``--to``,
:func:`print_provider_body`).

Shared pieces for every command here: :data:`RecordsArgument`,
:data:`KeyringOption`, :func:`load_keyring`, :func:`open_file` (records of a file with
their sealed fields opened) and :func:`print_json`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gelbridge._cli._app import app
from gelbridge._errors import (
    KEYRING_ENV,
    AdapterError,
    AdapterLoadError,
    ConfigError,
    GelbridgeError,
    KeyringError,
    RecordError,
)
from gelbridge._terminal import safe_json, safe_line, safe_text

if TYPE_CHECKING:  # imported where used: '--help' and the other commands need none of them
    from collections.abc import Mapping

    from gelbridge._config import Settings
    from gelbridge._sealing import Keyring, OpenedRecord
    from gelbridge.lux import Diagnostic, LuxRequest

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


BridgeKeyOption = Annotated[
    list[Path] | None,
    typer.Option("--bridge-key", help="Bridge key file ('gelbridge keys bridge-new'): also open what the file's "
                                      "key grants seal to it. Default: $GELBRIDGE_BRIDGE_KEY, then --config's "
                                      "[keyring] bridge_key."),
]


def load_keyring(path: Path | None) -> Keyring:
    """The keyring at ``path``, or a clear error naming both ways to give one."""
    if path is None:
        raise KeyringError(f"no keyring: pass --keyring FILE or set {KEYRING_ENV} (or --bridge-key FILE, to open "
                           "with the keys the file's key grants give)")
    from gelbridge._sealing import Keyring

    return Keyring.load(path)


def load_keys(records: Path, keyring: Path | None, bridge_key: list[Path] | None,
              settings: Settings | None = None) -> Mapping[str, bytes]:
    """The keyring, then the keys the record file's grants seal to the bridge key (when
    one is given: ``--bridge-key``, ``$GELBRIDGE_BRIDGE_KEY`` or the config's)."""
    import os

    from gelbridge._grants import keys_of_records, load_bridge_keys
    from gelbridge._records import KEY_GRANT_COLLECTION
    from gelbridge._records.io import load_records
    from gelbridge._sealing import Keyring

    paths = bridge_key or (list(settings.keyring.bridge_key) if settings is not None else [])
    bridge = load_bridge_keys(paths, os.environ)
    if not bridge:
        return load_keyring(keyring)
    ring = Keyring.load(keyring) if keyring is not None else Keyring()
    grants = ((e.uri.did, e.uri.rkey, e.value) for e in load_records(records)
              if e.uri.collection == KEY_GRANT_COLLECTION)
    return keys_of_records(grants, ring, bridge)


def open_file(records: Path, keyring: Mapping[str, bytes] | None) -> list[OpenedRecord]:
    """Every record of the file, chat.gel.assistant records parsed and opened.

    A sealed value copied from another record of the same file is reported as such.
    Records of other collections are passed through unchanged.
    """
    from gelbridge._records.io import load_records
    from gelbridge._sealing import CopySources, OpenedRecord, open_record

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
    """Pretty JSON on stdout: UTF-8, non-ASCII kept, but every character a terminal could
    interpret (C1 controls, bidi and other format characters, DEL) and every string that
    is not valid Unicode (a malformed record printed as it is) as a ``\\u`` escape, which
    is still JSON (``gelbridge._terminal.safe_json``)."""
    sys.stdout.write(safe_json(doc) + "\n")


@app.command("open")
def open_command(records: RecordsArgument, keyring: KeyringOption = None,
                 bridge_key: BridgeKeyOption = None) -> None:
    """Print records as JSON with every sealed content/instructions opened.

    Keys: the keyring, and with a bridge key the keys the file's key grants give it.
    Records that cannot be opened are printed as they are, with an "error" field;
    the command then exits non-zero.
    """
    ring = load_keys(records, keyring, bridge_key)
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
    from gelbridge._records.codec import to_json_form
    from gelbridge._records.nesting import cut

    shown: dict[str, Any] = to_json_form(cut(value))
    return shown



# --- convert ---------------------------------------------------------------------------


@dataclass(slots=True)
class ConvertResult:
    """What ``convert`` computed, with the worker's own turn: the first request it would
    send, to which provider, and every diagnostic of the way."""

    request: LuxRequest
    provider: str
    diagnostics: list[Diagnostic]


def convert_file(records: Path, keyring: Mapping[str, bytes], message: str, settings: Settings) -> ConvertResult:
    """The thread of ``message`` in a record file → the Lux IR request for its reply: the
    worker's turn up to its first model call (``gelbridge._worker.offline``)."""
    import asyncio

    from gelbridge._worker.offline import CaptureModel, run_offline

    capture = CaptureModel()
    turn = asyncio.run(run_offline(records, message, keyring, settings, model=capture, check_provider=False))
    if capture.request is None or capture.provider is None:
        raise _why_no_request(records, message, turn)
    return ConvertResult(capture.request, capture.provider, turn.diagnostics)


def _why_no_request(records: Path, message: str, turn: Any) -> GelbridgeError:
    """The turn ended before any model call: say why, as the reply would."""
    from gelbridge._records.io import load_records
    from gelbridge._records.models import MessageRecord

    if turn.decision == "bad-record":
        value = next(e.value for e in load_records(records) if e.uri.rkey == message)
        try:
            MessageRecord.from_value(value)
        except RecordError as e:
            return e
    if turn.reply is None:
        return RecordError(f"message {message} asks for no reply (a user message with generation is needed)")
    err = turn.reply.get("error") or {}
    why = err.get("message") or f"the reply ended {turn.reply.get('status')}"
    if err.get("kind") == "invalid_request" and "model" in why and "[defaults] model" in why:
        return ConfigError(f"{why}; set [defaults] model in the config (--config)")
    return GelbridgeError(f"no request: {why}")


def print_provider_body(adapter_name: str, result: ConvertResult, settings: Settings,
                        show_content: bool = False) -> None:
    """Print the provider request body adapter ``adapter_name`` builds for ``result``
    (stdout, pretty JSON when it is JSON) and the diagnostics (stderr)."""
    import json

    from gelbridge._adapters.client import provider_body, shaped_for
    from gelbridge._adapters.registry import registry_from_settings

    registry = registry_from_settings(settings)
    adapter = registry.get(adapter_name)
    shaping: list[Diagnostic] = []
    request, _ = shaped_for(result.request, adapter, settings.providers.get(result.provider), shaping)
    try:
        conv = provider_body(adapter, request, provider=result.provider, model=result.request.model)
    except AdapterError as e:
        if show_content or isinstance(e, AdapterLoadError):
            raise
        # a script's runtime error may quote the request (sealed content)
        raise GelbridgeError(f"adapter {adapter_name!r} failed on this request ({e.kind}); "
                             "add --show-content to see its message") from None
    try:
        text = safe_json(json.loads(conv.value))
    except ValueError:  # a body that is not JSON: as text, shown
        text = safe_text(conv.value)
    sys.stdout.write(text + "\n")
    for d in [*result.diagnostics, *shaping, *conv.diagnostics]:
        sys.stderr.write(safe_line(d.describe(show_content)) + "\n")


@app.command("convert")
def convert_command(
    records: RecordsArgument,
    message: Annotated[str, typer.Option("--message", help="Record key of the user message to answer.")],
    keyring: KeyringOption = None,
    bridge_key: BridgeKeyOption = None,
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
    from gelbridge._config import load_config

    settings = load_config(config)
    ring = load_keys(records, keyring, bridge_key, settings)
    result = convert_file(records, ring, message, settings)
    if to is not None:
        print_provider_body(to, result, settings, show_content)
        return
    print_json(result.request.to_json())
    for diag in result.diagnostics:
        sys.stderr.write(safe_line(diag.describe(show_content)) + "\n")
