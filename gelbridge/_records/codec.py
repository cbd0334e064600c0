"""atproto data-model plumbing: the JSON form (``$bytes``/``$link``) and the CBOR form.

In atproto JSON, bytes are ``{"$bytes": "<base64>"}`` and links ``{"$link": "<cid>"}``;
records decoded from CBOR (firehose, CAR files) hold raw ``bytes`` for both. These
helpers convert single fields (fast, used by the models) and whole values (used for
unknown parts and records gelbridge does not model).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import libipld

_multibase = libipld.decode_multibase
_CID_PREFIXES = (b"\x01\x71\x12\x20", b"\x01\x55\x12\x20")


def b64encode(data: bytes) -> str:
    """Standard base64 without padding, as the reference PDS writes ``$bytes``."""
    return base64.b64encode(data).decode("ascii").rstrip("=")


def bytes_json(data: bytes) -> dict[str, str]:
    """Raw bytes → their atproto JSON form ``{"$bytes": <unpadded standard base64>}``."""
    return {"$bytes": b64encode(data)}


def b64decode(text: str) -> bytes:
    """Standard base64 (RFC 4648 §4), padding optional; raise ValueError otherwise.

    Canonical unpadded base64 (what PDSes write) is decoded by libipld's multibase
    decoder, ~3x faster than ``binascii`` for a typical ciphertext; it accepts a strict
    subset of what the exact path below accepts (no padding, no stray trailing bits),
    so anything else simply takes the exact path.
    """
    if type(text) is str:
        try:
            return _multibase("m" + text)[1]
        except Exception:  # noqa: BLE001 - the exact path decides
            pass
    elif not isinstance(text, str):
        raise ValueError("$bytes must be a base64 string")
    text = text.rstrip("=")
    try:
        return binascii.a2b_base64(text + "=" * (-len(text) % 4), strict_mode=True)
    except (binascii.Error, ValueError):
        raise ValueError("$bytes is not standard base64") from None


def bytes_validator(max_length: int) -> Callable[[Any], bytes]:
    """The whole validator of a lexicon ``bytes`` field of at most ``max_length`` bytes.

    Takes either form (raw bytes from CBOR, ``{"$bytes": b64}`` from JSON) and does in
    one call what ``decode_bytes`` + a strict bytes check + a length check do.
    """

    def validate(value: Any) -> bytes:
        if type(value) is dict:
            if len(value) != 1 or "$bytes" not in value:
                raise ValueError('bytes must be {"$bytes": "<base64>"} in JSON')
            raw = b64decode(value["$bytes"])
        elif isinstance(value, bytes):
            raw = value
        elif isinstance(value, (bytearray, memoryview)):
            raw = bytes(value)
        else:
            raise ValueError("Input should be a valid bytes")
        if len(raw) > max_length:
            raise ValueError(f"Data should have at most {max_length} bytes")
        return raw

    return validate


def decode_bytes(value: Any) -> Any:
    """A bytes field in either form → ``bytes`` (other input is left for the type check)."""
    if type(value) is dict:
        if len(value) == 1 and "$bytes" in value:
            return b64decode(value["$bytes"])
        raise ValueError('bytes must be {"$bytes": "<base64>"} in JSON')
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def cid_str(raw: bytes) -> str:
    """The string form of a binary CID (as decoded from CBOR); ValueError if invalid."""
    try:
        return libipld.encode_cid(raw)
    except Exception:
        raise ValueError("link is not a valid CID") from None


def check_cid_str(text: str) -> str:
    """Return ``text`` if it is a valid CID string; ValueError otherwise."""
    try:
        libipld.decode_cid(text)
    except Exception:
        raise ValueError("link is not a valid CID string") from None
    return text


def decode_link(value: Any) -> Any:
    """A link in either form (``{"$link": cid}``, raw CID bytes, CID object) → CID string."""
    if type(value) is dict:
        if len(value) == 1 and "$link" in value and isinstance(value["$link"], str):
            return check_cid_str(value["$link"])
        raise ValueError('link must be {"$link": "<cid>"} in JSON')
    if isinstance(value, bytes):
        return cid_str(value)
    if hasattr(value, "encode") and type(value).__name__ == "CID":
        return str(value)
    if isinstance(value, str):
        raise ValueError('link must be {"$link": "<cid>"}, not a bare string')
    return value


def looks_like_cid(raw: bytes) -> bool:
    """True for a CIDv1 sha-256 in binary form (what libipld decodes a link into)."""
    return len(raw) == 36 and raw[:4] in _CID_PREFIXES


def to_json_form(value: Any) -> Any:
    """Any decoded atproto value → its JSON form (bytes → ``$bytes``, CIDs → ``$link``).

    CBOR decoding turns links and byte strings alike into ``bytes``; a blob's ``ref``
    and any 36-byte binary CIDv1/sha-256 are taken as links, everything else as bytes.
    """
    if isinstance(value, dict):
        is_blob = value.get("$type") == "blob"
        out = {}
        for k, v in value.items():
            if is_blob and k == "ref" and isinstance(v, bytes):
                out[k] = {"$link": cid_str(v)}
            else:
                out[k] = to_json_form(v)
        return out
    if isinstance(value, list):
        return [to_json_form(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        if looks_like_cid(raw):
            return {"$link": cid_str(raw)}
        return bytes_json(raw)
    if type(value).__name__ == "CID":
        return {"$link": str(value)}
    return value


def cbor_size(value: Any) -> int:
    """Upper estimate of the DAG-CBOR size of ``value`` (either form), without encoding.

    Counts every header as 9 bytes, so it errs high by a few bytes per item; cheap
    enough to run on every record read.
    """
    t = type(value)
    if t is dict:
        if "$bytes" in value and len(value) == 1 and type(value["$bytes"]) is str:
            return 9 + len(value["$bytes"]) * 3 // 4
        if "$link" in value and len(value) == 1:
            return 50
        size = 9
        for k, v in value.items():
            if type(v) is str:
                size += 18 + len(k) + (len(v) if v.isascii() else len(v.encode("utf-8", "surrogatepass")))
            else:
                size += 9 + len(k) + cbor_size(v)
        return size
    if t is str:
        return 9 + (len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass")))
    if t is list:
        size = 9
        for v in value:
            size += cbor_size(v)
        return size
    if t is bytes:
        return 9 + len(value)
    return 9
