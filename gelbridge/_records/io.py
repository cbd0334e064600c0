"""Reading record files: listRecords JSON, a bare JSON array, or a repo CAR export.

- ``com.atproto.repo.listRecords`` output: ``{"records": [{"uri", "cid", "value"}]}``;
- a bare JSON array of such entries;
- a CAR file from ``com.atproto.sync.getRepo``: the commit (root block) names the MST
  root; walking the MST in order yields ``collection/rkey`` keys (prefix-compressed)
  and the CID of each record block.

Values from CAR files are in CBOR form (raw bytes); the record models accept both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libipld
from atproto_core.car import CAR

from gelbridge._errors import RecordError
from gelbridge._records import nesting
from gelbridge._records.codec import cid_str
from gelbridge._records.keys import AtUri

#: Deepest MST gelbridge walks (a repo of 2^64 records is ~16 levels at fanout 16).
MAX_MST_DEPTH = 64


@dataclass(frozen=True, slots=True)
class RecordEntry:
    """One record as listed: where it lives, its CID (if known) and its decoded value."""

    uri: AtUri
    cid: str | None
    value: dict[str, Any]


def load_records(path: str | os.PathLike[str]) -> list[RecordEntry]:
    """Read a record file (listRecords JSON, JSON array, or getRepo CAR)."""
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise RecordError(f"record file {p} does not exist") from None
    except OSError as e:
        raise RecordError(f"cannot read record file {p}: {e.strerror}") from None
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            doc = nesting.loads(data)
        except ValueError as e:
            raise RecordError(f"record file {p} is not valid JSON (line {getattr(e, 'lineno', '?')})") from None
        return records_from_json(doc, source=str(p))
    return records_from_car(data, source=str(p))


def records_from_json(doc: Any, *, source: str = "record list") -> list[RecordEntry]:
    """Entries of a listRecords response (``{"records": [...]}``) or a bare array."""
    if isinstance(doc, dict) and isinstance(doc.get("records"), list):
        items = doc["records"]
    elif isinstance(doc, list):
        items = doc
    else:
        raise RecordError(
            f'{source}: expected a listRecords response {{"records": [...]}} or a JSON array of '
            '{"uri", "cid", "value"} entries'
        )
    out: list[RecordEntry] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("value"), dict) or "uri" not in item:
            raise RecordError(f'{source}: entry {i} needs "uri" and an object "value"')
        cid = item.get("cid")
        if cid is not None and not isinstance(cid, str):
            raise RecordError(f"{source}: entry {i} has a non-string cid")
        try:
            uri = AtUri.parse(item["uri"])
        except RecordError as e:
            raise RecordError(f"{source}: entry {i}: {e}") from None
        out.append(RecordEntry(uri=uri, cid=cid, value=item["value"]))
    return out


def records_from_car(data: bytes, *, source: str = "CAR file") -> list[RecordEntry]:
    """Every record of a repo CAR export, in MST (key) order."""
    try:
        car = CAR.from_bytes(data)
        blocks: dict[str, Any] = {str(cid): block for cid, block in car.blocks.items()}
        root = str(car.root)
    except RecursionError:
        raise RecordError(f"{source}: a block is nested too deep to decode (gelbridge's limit is "
                          f"{nesting.MAX_DEPTH} levels)") from None
    except Exception:  # libipld: ValueError for a bad CAR, others for a header whose root is no CID
        raise RecordError(
            f"{source} is neither JSON (listRecords) nor a CAR file (com.atproto.sync.getRepo) "
            "with a CID as its root"
        ) from None
    commit = blocks.get(root)
    if not isinstance(commit, dict) or not isinstance(commit.get("did"), str) or "data" not in commit:
        raise RecordError(f"{source}: the root block is not a repo commit (needs did and data)")
    if commit.get("version") not in (2, 3):
        raise RecordError(f"{source}: unsupported repo version {commit.get('version')!r}")
    did = commit["did"]
    out: list[RecordEntry] = []
    for key, rcid in _walk_mst(blocks, _link(commit["data"], source), source):
        collection, sep, rkey = key.partition("/")
        if not sep:
            raise RecordError(f"{source}: MST key {key!r} is not collection/rkey")
        value = blocks.get(rcid)
        if value is None:
            raise RecordError(f"{source}: the block of record {key} is missing: not a full repo export")
        if not isinstance(value, dict):
            raise RecordError(f"{source}: record {key} is not an object")
        out.append(RecordEntry(uri=AtUri(did, collection, rkey), cid=rcid, value=value))
    return out


def _link(value: Any, source: str) -> str:
    if isinstance(value, bytes):
        try:
            return cid_str(value)
        except ValueError:
            pass
    raise RecordError(f"{source}: expected a CID link in the repo structure")


def _walk_mst(blocks: dict[str, Any], node_cid: str, source: str) -> list[tuple[str, str]]:
    """In-order (key, value CID) pairs of the MST rooted at ``node_cid``."""
    out: list[tuple[str, str]] = []
    stack_guard: set[str] = set()

    def walk(cid: str, depth: int) -> None:
        if depth > MAX_MST_DEPTH or cid in stack_guard:
            raise RecordError(f"{source}: the repo tree is too deep or loops")
        node = blocks.get(cid)
        if not isinstance(node, dict) or not isinstance(node.get("e"), list):
            raise RecordError(f"{source}: MST node {cid} is missing or malformed")
        stack_guard.add(cid)
        if node.get("l") is not None:
            walk(_link(node["l"], source), depth + 1)
        prev = b""
        for entry in node["e"]:
            if not isinstance(entry, dict):
                raise RecordError(f"{source}: malformed MST entry in node {cid}")
            p, k = entry.get("p"), entry.get("k")
            if not isinstance(p, int) or not isinstance(k, bytes) or p > len(prev):
                raise RecordError(f"{source}: malformed MST entry in node {cid}")
            key = prev[:p] + k
            try:
                out.append((key.decode("utf-8"), _link(entry.get("v"), source)))
            except UnicodeDecodeError:
                raise RecordError(f"{source}: MST key in node {cid} is not UTF-8") from None
            prev = key
            if entry.get("t") is not None:
                walk(_link(entry["t"], source), depth + 1)
        stack_guard.discard(cid)

    walk(node_cid, 0)
    return out


# --- writing CAR files (tests, demos) -------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def block_cid(block: bytes) -> bytes:
    """The binary CIDv1 (dag-cbor, sha-256) of an encoded block."""
    import hashlib

    return b"\x01\x71\x12\x20" + hashlib.sha256(block).digest()


def encode_car(root: bytes, blocks: list[bytes]) -> bytes:
    """A CARv1 file with ``root`` (binary CID) and the given DAG-CBOR blocks."""
    header = libipld.encode_dag_cbor({"roots": [root], "version": 1})
    out = bytearray(_varint(len(header)) + header)
    for block in blocks:
        cid = block_cid(block)
        out += _varint(len(cid) + len(block)) + cid + block
    return bytes(out)
