"""AT-URIs, record keys, TIDs and the reply key scheme ``K.r{n}``.

Pure functions; the only state is the TID clock (monotonic within a process).
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from dataclasses import dataclass

from gelbridge._errors import RecordError
from gelbridge._records.constants import MAX_ATTEMPT

_RKEY_RE = re.compile(r"[A-Za-z0-9._:~-]{1,512}")
_NSID_RE = re.compile(
    r"(?![0-9])[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,}\.[A-Za-z][A-Za-z0-9]{0,62}"
)
_DID_RE = re.compile(r"did:[a-z]+:[A-Za-z0-9._:%-]*[A-Za-z0-9._-]")
_TID_RE = re.compile(r"[234567abcdefghij][234567abcdefghijklmnopqrstuvwxyz]{12}")
_B32 = "234567abcdefghijklmnopqrstuvwxyz"
# The attempt numbers of reply keys in canonical form ("0".."1000", no leading zero).
_ATTEMPTS = {str(n): n for n in range(MAX_ATTEMPT + 1)}


def is_valid_rkey(rkey: str) -> bool:
    """True if ``rkey`` is a valid atproto record key (any key type)."""
    return bool(_RKEY_RE.fullmatch(rkey)) and rkey not in (".", "..")


def check_rkey(rkey: str) -> str:
    """Return ``rkey`` or raise RecordError if it is not a valid record key."""
    if not isinstance(rkey, str) or not is_valid_rkey(rkey):
        raise RecordError(
            f"invalid record key {rkey!r}: use 1-512 characters of A-Za-z0-9 . - _ : ~"
        )
    return rkey


def is_valid_nsid(nsid: str) -> bool:
    """True if ``nsid`` looks like an NSID (reversed domain plus name)."""
    return len(nsid) <= 317 and bool(_NSID_RE.fullmatch(nsid))


def is_valid_did(did: str) -> bool:
    """True if ``did`` has DID syntax (``did:method:identifier``)."""
    return len(did) <= 2048 and bool(_DID_RE.fullmatch(did))


# --- TIDs -------------------------------------------------------------------------------


def is_tid(s: str) -> bool:
    """True if ``s`` is a TID: 13 base32-sortable characters, top bit zero."""
    return isinstance(s, str) and bool(_TID_RE.fullmatch(s))


def tid_from_parts(micros: int, clock_id: int) -> str:
    """Encode a TID from microseconds since the epoch and a 10-bit clock id."""
    if not 0 <= micros < 1 << 53 or not 0 <= clock_id < 1 << 10:
        raise ValueError("TID timestamp or clock id out of range")
    n = (micros << 10) | clock_id
    return "".join(_B32[(n >> (5 * i)) & 31] for i in range(12, -1, -1))


def tid_timestamp_micros(tid: str) -> int:
    """Microseconds since the epoch encoded in a TID."""
    if not is_tid(tid):
        raise RecordError(f"invalid TID {tid!r}")
    n = 0
    for ch in tid:
        n = (n << 5) | _B32.index(ch)
    return n >> 10


_tid_lock = threading.Lock()
_tid_last = 0
_tid_clock = secrets.randbelow(1 << 10)


def new_tid() -> str:
    """A fresh TID for the current time, strictly increasing within this process."""
    global _tid_last
    with _tid_lock:
        micros = max(time.time_ns() // 1000, _tid_last + 1)
        _tid_last = micros
    return tid_from_parts(micros, _tid_clock)


# --- replies ------------------------------------------------------------------------------


def reply_rkey(message_rkey: str, attempt: int) -> str:
    """The record key of the reply to ``message_rkey`` for ``attempt``: ``K.r{n}``."""
    check_rkey(message_rkey)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 0 <= attempt <= MAX_ATTEMPT:
        raise RecordError(f"reply attempt must be an integer 0..{MAX_ATTEMPT}, not {attempt!r}")
    key = f"{message_rkey}.r{attempt}"
    return check_rkey(key)


def parse_reply_rkey(rkey: str) -> tuple[str, int] | None:
    """``(K, n)`` if ``rkey`` is a reply key ``K.r{n}`` (canonical n, 0..1000), else None."""
    # No regex: the thread walk parses every reply key of a thread on every turn.
    base, sep, n = rkey.rpartition(".r")
    attempt = _ATTEMPTS.get(n)
    if not sep or attempt is None or not is_valid_rkey(base):
        return None
    return base, attempt


# --- AT-URIs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AtUri:
    """``at://<did>/<collection>/<rkey>``: the address of one record (and its sealing context)."""

    did: str
    collection: str
    rkey: str

    def __post_init__(self) -> None:
        if not is_valid_did(self.did):
            raise RecordError(f"invalid DID {self.did!r} in AT-URI: expected did:<method>:<id>")
        if not is_valid_nsid(self.collection):
            raise RecordError(f"invalid collection {self.collection!r} in AT-URI: expected an NSID")
        check_rkey(self.rkey)

    @classmethod
    def parse(cls, uri: str) -> AtUri:
        """Parse ``at://did/collection/rkey``; raise RecordError on anything else."""
        if not isinstance(uri, str) or not uri.startswith("at://"):
            raise RecordError(f"invalid AT-URI {uri!r}: expected at://<did>/<collection>/<rkey>")
        parts = uri[5:].split("/")
        if len(parts) != 3 or not all(parts):
            raise RecordError(f"invalid AT-URI {uri!r}: expected at://<did>/<collection>/<rkey>")
        return cls(parts[0], parts[1], parts[2])

    def __str__(self) -> str:
        return f"at://{self.did}/{self.collection}/{self.rkey}"

    def with_rkey(self, rkey: str) -> AtUri:
        """The URI of another record in the same collection."""
        return AtUri(self.did, self.collection, rkey)
