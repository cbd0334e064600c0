"""Offline record commands: ``gelbridge open`` (and later ``convert``).

Shared pieces for every command here: :data:`RecordsArgument`,
:data:`KeyringOption`, :func:`load_keyring`, :func:`open_file` (records of a file with
their sealed fields opened) and :func:`print_json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gelbridge.cli import app
from gelbridge.errors import GelbridgeError, KeyringError
from gelbridge.records.io import load_records
from gelbridge.sealing import KEYRING_ENV, Keyring, OpenedRecord, open_record

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
    uris = [e.uri for e in entries]
    out: list[OpenedRecord] = []
    for e in entries:
        if not e.uri.collection.startswith("chat.gel.assistant."):
            out.append(OpenedRecord(e.uri, e.cid, e.value))
            continue
        out.append(open_record(e.uri, e.cid, e.value, keyring=keyring, candidate_uris=uris))
    return out


def print_json(doc: Any) -> None:
    """Pretty JSON on stdout (UTF-8, non-ASCII kept)."""
    sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


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
    from gelbridge.records.codec import to_json_form

    return to_json_form(value)
