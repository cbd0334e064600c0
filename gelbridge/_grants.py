"""Key grants (PROTOCOL.md §6, scheme ``hpke-x25519-v1``): the bridge key, sealing a
conversation key to it, and which grants of an account are honoured.

Pure except for reading and writing a key file. The HPKE is pyca ``cryptography``'s
(RFC 9180 base mode, single shot: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20-Poly1305, empty ``aad``; everything that binds a grant to its place goes into
``info``).

- :class:`BridgeKey`: an X25519 private key with its ``kid`` (the record key of its
  ``chat.gel.assistant.bridge`` record) and the operator's ``name``. File form (mode
  0600): ``{"scheme", "kid", "name"?, "privateKey": base64, "publicKey": base64}``.
- :func:`seal_key` / :func:`open_sealed_key`: what an app and the bridge do with one key.
- :class:`GrantBook`: the grants of one account, as record events arrive (§6 "What the
  bridge does"): honoured or ignored with a reason; the smaller record key wins a
  conflict; the operator's keyring wins over every grant.
- :class:`AccountKeys`: the keys a worker opens and seals with: its keyring, then the
  honoured grants (a ``Mapping[str, bytes]``, read live, so a revocation applies to the
  next message at once; :meth:`AccountKeys.snapshot` pins them for a reply running).

Key bytes live in memory only: no ``repr`` here shows one, no reason names one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite

from gelbridge._errors import KeyringError, UnknownKeyError
from gelbridge._records import nesting
from gelbridge._records.codec import b64encode
from gelbridge._records.constants import KEY_GRANT_COLLECTION
from gelbridge._sealing import KEY_BYTES, check_key_id

GRANT_SCHEME: Final = "hpke-x25519-v1"
#: ``enc`` (32) ‖ ChaCha20-Poly1305 ciphertext of a 32-byte key (32 + 16 tag)
SEALED_KEY_BYTES: Final = 80
#: ``$GELBRIDGE_BRIDGE_KEY``: the base64 private key, or the whole text of a key file
BRIDGE_KEY_ENV: Final = "GELBRIDGE_BRIDGE_KEY"

_SUITE: Final = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305)
_KID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def check_kid(kid: str) -> str:
    """A bridge key's ``kid``: 1-64 of ``A-Za-z0-9._:-`` (it is also a record key)."""
    if not isinstance(kid, str) or not _KID.fullmatch(kid) or kid in (".", ".."):
        raise KeyringError(f"bridge key id {kid!r} must be 1-64 characters of A-Za-z0-9._:- (not . or ..)")
    return kid


def fingerprint(public_key: bytes) -> str:
    """What people compare when pairing an app with a bridge: the first 12 bytes of
    SHA-256(public key), lowercase hex, in groups of 4 joined by ``-``."""
    h = hashlib.sha256(public_key).hexdigest()[:24]
    return "-".join(h[i:i + 4] for i in range(0, 24, 4))


def grant_info(uri: str, key_id: str, recipient: str) -> bytes:
    """HPKE ``info`` of a grant: its scheme, its own AT-URI, the keyId and the bridge kid."""
    return f"{GRANT_SCHEME}\n{uri}\n{key_id}\n{recipient}".encode()


def grant_uri(did: str, rkey: str) -> str:
    return f"at://{did}/{KEY_GRANT_COLLECTION}/{rkey}"


def seal_key(key: bytes, *, public_key: bytes, uri: str, key_id: str, recipient: str) -> bytes:
    """Seal a 32-byte conversation key to a bridge's X25519 ``public_key`` (the app's side):
    the grant's ``sealedKey``, ``enc ‖ ct`` (80 bytes)."""
    if len(key) != KEY_BYTES:
        raise KeyringError(f"a conversation key is {KEY_BYTES} bytes, not {len(key)}")
    if len(public_key) != 32:
        raise KeyringError("a bridge public key is 32 bytes")
    pub = X25519PublicKey.from_public_bytes(public_key)
    return _SUITE.encrypt(key, pub, grant_info(uri, key_id, recipient))


def open_sealed_key(sealed: bytes, *, private_key: X25519PrivateKey, uri: str, key_id: str,
                    recipient: str) -> bytes | None:
    """The key a grant seals, or None when it does not open with this key and context."""
    if len(sealed) != SEALED_KEY_BYTES:
        return None
    try:
        key = _SUITE.decrypt(sealed, private_key, grant_info(uri, key_id, recipient))
    except Exception:  # InvalidTag, or a malformed enc: either way it is not ours
        return None
    return key if len(key) == KEY_BYTES else None


# --- the bridge key -------------------------------------------------------------------------


def _raw_public(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _raw_private(private: X25519PrivateKey) -> bytes:
    return private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                 serialization.NoEncryption())


def default_kid(public_key: bytes) -> str:
    """The kid of a key made without ``--kid``: its fingerprint's first 8 bytes (stable, so
    a key given as bare base64 in the environment keeps its record)."""
    return "b-" + fingerprint(public_key).replace("-", "")[:16]


@dataclass(frozen=True, eq=False)
class BridgeKey:
    """One bridge key: ``kid``, the private key, the operator's ``name`` for the bridge."""

    kid: str
    private_key: X25519PrivateKey = field(repr=False)
    name: str | None = None

    def __post_init__(self) -> None:
        check_kid(self.kid)
        if self.name is not None and len(self.name.encode()) > 64:
            raise KeyringError("a bridge name is at most 64 bytes")

    def __repr__(self) -> str:
        return f"BridgeKey(kid={self.kid!r}, fingerprint={self.fingerprint!r})"

    __str__ = __repr__

    @property
    def public_key(self) -> bytes:
        return _raw_public(self.private_key)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    @classmethod
    def generate(cls, kid: str | None = None, name: str | None = None) -> BridgeKey:
        private = X25519PrivateKey.generate()
        return cls(kid if kid is not None else default_kid(_raw_public(private)), private, name)

    @classmethod
    def from_private_bytes(cls, raw: bytes, *, kid: str | None = None, name: str | None = None) -> BridgeKey:
        if len(raw) != 32:
            raise KeyringError(f"a bridge private key is 32 bytes, not {len(raw)}")
        private = X25519PrivateKey.from_private_bytes(raw)
        return cls(kid if kid is not None else default_kid(_raw_public(private)), private, name)

    @classmethod
    def parse(cls, text: str, *, source: str) -> BridgeKey:
        """A key file's text, or a bare base64 private key (the environment's short form)."""
        text = text.strip()
        if not text.startswith("{"):
            return cls.from_private_bytes(_b64(text, source, "the private key"))
        try:
            data = nesting.loads(text)
        except ValueError:
            raise KeyringError(f"{source} is not valid JSON") from None
        if not isinstance(data, dict) or data.get("scheme") != GRANT_SCHEME or not isinstance(
                data.get("privateKey"), str):
            raise KeyringError(f'{source}: expected a bridge key file {{"scheme": "{GRANT_SCHEME}", "kid": ..., '
                               '"privateKey": ...}} (make one with: gelbridge keys bridge-new --out FILE)')
        kid, name = data.get("kid"), data.get("name")
        if kid is not None and not isinstance(kid, str) or name is not None and not isinstance(name, str):
            raise KeyringError(f"{source}: kid and name must be strings")
        key = cls.from_private_bytes(_b64(data["privateKey"], source, "privateKey"), kid=kid, name=name)
        if isinstance(data.get("publicKey"), str) and _b64(data["publicKey"], source, "publicKey") != key.public_key:
            raise KeyringError(f"{source}: publicKey does not belong to privateKey (the file is damaged)")
        return key

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BridgeKey:
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise KeyringError(f"bridge key file {p} does not exist: make one with "
                               f"'gelbridge keys bridge-new --out {p}'") from None
        except (OSError, UnicodeDecodeError) as e:
            raise KeyringError(f"cannot read bridge key file {p}: {getattr(e, 'strerror', None) or e}") from None
        return cls.parse(text, source=f"bridge key file {p}")

    def to_json(self) -> dict[str, Any]:
        """The file form. Holds the private key: write it only to the key file."""
        out: dict[str, Any] = {"scheme": GRANT_SCHEME, "kid": self.kid}
        if self.name is not None:
            out["name"] = self.name
        out["privateKey"] = base64.b64encode(_raw_private(self.private_key)).decode("ascii")
        out["publicKey"] = base64.b64encode(self.public_key).decode("ascii")
        return out

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the key file, mode 0600 from the start (never world-readable, not even briefly)."""
        p = Path(path).expanduser()
        if p.exists() and not overwrite:
            raise KeyringError(f"{p} exists already; a bridge key is never overwritten (choose another path)")
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".bridge-key-", dir=p.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_json(), f, indent=2)
                f.write("\n")
            if overwrite:
                os.replace(tmp, p)
            else:
                os.link(tmp, p)  # fails if p appeared meanwhile
                os.unlink(tmp)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def record_value(self, created_at: str) -> dict[str, Any]:
        """The ``chat.gel.assistant.bridge`` record for this key (atproto JSON form)."""
        from gelbridge._records.constants import BRIDGE_COLLECTION

        out: dict[str, Any] = {"$type": BRIDGE_COLLECTION, "scheme": GRANT_SCHEME,
                               "publicKey": {"$bytes": b64encode(self.public_key)}}
        if self.name is not None:
            out["name"] = self.name
        out["createdAt"] = created_at
        return out

    def is_published_by(self, record: Mapping[str, Any] | None) -> bool:
        """True when ``record`` (a bridge record, either form) names this key as it would."""
        if not isinstance(record, Mapping):
            return False
        pub = bytes_field(record.get("publicKey"))
        return (record.get("scheme") == GRANT_SCHEME and pub == self.public_key
                and record.get("name") == self.name and isinstance(record.get("createdAt"), str))


def _b64(text: Any, source: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise KeyringError(f"{source}: {what} must be base64 text")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise KeyringError(f"{source}: {what} is not standard base64") from None


def bytes_field(value: Any) -> bytes | None:
    """A record's bytes field in either form (raw, or JSON ``{"$bytes": base64}``), or None."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Mapping) and set(value) == {"$bytes"} and isinstance(value["$bytes"], str):
        try:
            return base64.b64decode(value["$bytes"] + "=" * (-len(value["$bytes"]) % 4), validate=True)
        except (binascii.Error, ValueError):
            return None
    return None


class BridgeKeys(Sequence[BridgeKey]):
    """The bridge keys a process holds; the first is the current one (published, granted to)."""

    def __init__(self, keys: Sequence[BridgeKey] = ()) -> None:
        kids = [k.kid for k in keys]
        if len(set(kids)) != len(kids):
            raise KeyringError(f"two bridge keys share a kid: {sorted(k for k in kids if kids.count(k) > 1)[0]!r}")
        self._keys = tuple(keys)
        self._by_kid = {k.kid: k for k in keys}

    def __getitem__(self, i: Any) -> Any:
        return self._keys[i]

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"BridgeKeys({[k.kid for k in self._keys]!r})"

    @property
    def current(self) -> BridgeKey | None:
        return self._keys[0] if self._keys else None

    def by_kid(self, kid: str) -> BridgeKey | None:
        return self._by_kid.get(kid)


def load_bridge_keys(paths: Sequence[str | os.PathLike[str]], environ: Mapping[str, str]) -> BridgeKeys:
    """``$GELBRIDGE_BRIDGE_KEY`` (first, when set), then each ``[keyring] bridge_key`` file."""
    keys: list[BridgeKey] = []
    if environ.get(BRIDGE_KEY_ENV):
        keys.append(BridgeKey.parse(environ[BRIDGE_KEY_ENV], source=f"${BRIDGE_KEY_ENV}"))
    keys.extend(BridgeKey.load(p) for p in paths)
    return BridgeKeys(keys)


# --- the grants of one account ----------------------------------------------------------------


#: Why a grant is not honoured, by code (the code is a metric label; the text a log line's).
IGNORED_BECAUSE: Final[Mapping[str, str]] = {
    "lexicon": "it does not follow the keyGrant lexicon",
    "key_id": "its keyId is not a valid key id",
    "scheme": "its scheme is not hpke-x25519-v1",
    "recipient": "its recipient is not a bridge key of this bridge",
    "sealed_key": "its sealedKey does not open for this record, keyId and recipient",
    "keyring": "the operator's keyring holds another key for its keyId",
    "conflict": "a grant with a smaller record key gives another key for its keyId",
}


@dataclass(frozen=True, slots=True)
class GrantVerdict:
    """What became of one grant record: honoured (``code`` None) or ignored (``code`` a key
    of :data:`IGNORED_BECAUSE`; never key material). ``key`` is held only when it opened."""

    rkey: str
    key_id: str | None
    code: str | None = None
    key: bytes | None = field(default=None, repr=False)
    winner: str | None = None  # a conflict: the record key of the grant that won

    @property
    def honoured(self) -> bool:
        return self.code is None

    @property
    def reason(self) -> str | None:
        if self.code == "conflict" and self.winner is not None:
            return f"grant {self.winner} (a smaller record key) gives another key for its keyId"
        return IGNORED_BECAUSE[self.code] if self.code is not None else None


def read_grant(value: Any, *, did: str, rkey: str, bridge: BridgeKeys) -> GrantVerdict:
    """Open one ``chat.gel.assistant.keyGrant`` record (§6 "What the bridge does" 2)."""
    from gelbridge._errors import RecordError
    from gelbridge._records.models import KeyGrantRecord

    try:
        g = KeyGrantRecord.from_value(value, uri=grant_uri(did, rkey))
    except RecordError:
        return GrantVerdict(rkey, None, "lexicon")
    try:
        check_key_id(g.key_id)
    except KeyringError:
        return GrantVerdict(rkey, None, "key_id")
    if g.scheme != GRANT_SCHEME:
        return GrantVerdict(rkey, g.key_id, "scheme")
    bk = bridge.by_kid(g.recipient)
    if bk is None:
        return GrantVerdict(rkey, g.key_id, "recipient")
    key = open_sealed_key(g.sealed_key, private_key=bk.private_key, uri=grant_uri(did, rkey),
                          key_id=g.key_id, recipient=g.recipient)
    if key is None:
        return GrantVerdict(rkey, g.key_id, "sealed_key")
    return GrantVerdict(rkey, g.key_id, None, key)


class GrantBook:
    """The grants of one account, kept as their events arrive.

    :attr:`keys` changes in place (a running reply pins its key with
    :meth:`AccountKeys.pinned`). A change re-decides only the grants naming the same ``keyId`` (a conflict is among
    those), so one event costs the same in a book of ten grants or of ten thousand;
    :attr:`last_changes` lists what it changed, ``(rkey, before, after)``, for the log.
    """

    def __init__(self, did: str, bridge: BridgeKeys, keyring: Mapping[str, bytes]) -> None:
        self.did, self.bridge, self.keyring = did, bridge, keyring
        self._opened: dict[str, GrantVerdict] = {}  # rkey → verdict of the record alone
        self._by_key_id: dict[str | None, set[str]] = {}  # keyId → rkeys naming it
        self.keys: dict[str, bytes] = {}
        self.verdicts: dict[str, GrantVerdict] = {}  # rkey → final verdict (conflicts applied)
        self.honoured = 0
        self.last_changes: list[tuple[str, GrantVerdict | None, GrantVerdict | None]] = []

    @property
    def ignored(self) -> int:
        return len(self.verdicts) - self.honoured

    def put(self, rkey: str, value: Any) -> GrantVerdict:
        """A grant record created or updated; its final verdict."""
        v = read_grant(value, did=self.did, rkey=rkey, bridge=self.bridge)
        old = self._drop(rkey)
        self._opened[rkey] = v
        self._by_key_id.setdefault(v.key_id, set()).add(rkey)
        self._settle({v.key_id} | ({old.key_id} if old is not None else set()))
        return self.verdicts[rkey]

    def delete(self, rkey: str) -> bool:
        """A grant record deleted: its key is forgotten (True when it was known)."""
        old = self._drop(rkey)
        if old is None:
            self.last_changes = []
            return False
        self._settle({old.key_id}, dropped=rkey)
        return True

    def replace(self, values: Mapping[str, Any]) -> None:
        """The account's whole set of grant records (``rkey → value``), as listed."""
        self._opened = {rkey: read_grant(v, did=self.did, rkey=rkey, bridge=self.bridge) for rkey, v in values.items()}
        self._by_key_id = {}
        for rkey, v in self._opened.items():
            self._by_key_id.setdefault(v.key_id, set()).add(rkey)
        before = self.verdicts
        self.keys, self.verdicts, self.honoured = {}, {}, 0
        self._settle(set(self._by_key_id), before=before)

    def clear(self) -> None:
        self.replace({})

    def _drop(self, rkey: str) -> GrantVerdict | None:
        old = self._opened.pop(rkey, None)
        if old is not None:
            group = self._by_key_id.get(old.key_id)
            if group is not None:
                group.discard(rkey)
                if not group:
                    del self._by_key_id[old.key_id]
        return old

    def _settle(self, key_ids: set[str | None], *, before: Mapping[str, GrantVerdict] | None = None,
                dropped: str | None = None) -> None:
        """Apply §6.3's order to the grants naming ``key_ids``: keyring first, then the
        smallest rkey; every other grant keeps its verdict. ``dropped``: a deleted rkey."""
        prior = self.verdicts if before is None else before
        keys = self.keys
        changes: list[tuple[str, GrantVerdict | None, GrantVerdict | None]] = []
        if dropped is not None:
            self._set(dropped, None, prior.get(dropped), changes)
        for kid in key_ids:
            if kid is not None:
                keys.pop(kid, None)
            winner: str | None = None
            for rkey in sorted(self._by_key_id.get(kid, ())):
                v = self._opened[rkey]
                key = v.key
                if v.honoured and kid is not None and key is not None:
                    mine = self.keyring[kid] if kid in self.keyring else None
                    if mine is not None and mine != key:
                        v = GrantVerdict(rkey, kid, "keyring")
                    elif winner is not None and keys[kid] != key:
                        v = GrantVerdict(rkey, kid, "conflict", winner=winner)
                    elif winner is None:
                        keys[kid], winner = key, rkey
                self._set(rkey, v, prior.get(rkey), changes)
        if before is not None:
            for rkey, old in before.items():
                if rkey not in self._opened:
                    changes.append((rkey, old, None))
        self.keys, self.last_changes = keys, changes

    def _set(self, rkey: str, v: GrantVerdict | None, old: GrantVerdict | None,
             changes: list[tuple[str, GrantVerdict | None, GrantVerdict | None]]) -> None:
        current = self.verdicts.pop(rkey, None)
        if current is not None and current.honoured:
            self.honoured -= 1
        if v is not None:
            self.verdicts[rkey] = v
            self.honoured += v.honoured
        if (old is None) != (v is None) or old is not None and v is not None and (
                old.code, old.key_id, old.key) != (v.code, v.key_id, v.key):
            changes.append((rkey, old, v))


def keys_of_records(grants: Iterable[tuple[str, str, Any]], keyring: Mapping[str, bytes],
                    bridge: BridgeKeys) -> AccountKeys:
    """The keys a record file gives (``gelbridge open`` / ``convert`` / ``reply``): the
    keyring, then what its grant records ``(did, rkey, value)`` seal to ``bridge``, by the
    same rules as a running bridge (each DID's grants bind to that DID)."""
    by_did: dict[str, dict[str, Any]] = {}
    for did, rkey, value in grants:
        by_did.setdefault(did, {})[rkey] = value
    merged: dict[str, bytes] = {}
    for did in sorted(by_did):
        book = GrantBook(did, bridge, keyring)
        book.replace(by_did[did])
        for key_id, key in book.keys.items():
            merged.setdefault(key_id, key)
    return AccountKeys(keyring, None, merged)


class AccountKeys(Mapping[str, bytes]):
    """The keys one account's worker uses: the operator's keyring, then its honoured
    grants (live: ``book.keys`` is read at each lookup)."""

    __slots__ = ("keyring", "book", "_grants")

    def __init__(self, keyring: Mapping[str, bytes], book: GrantBook | None = None,
                 _grants: Mapping[str, bytes] | None = None) -> None:
        self.keyring, self.book, self._grants = keyring, book, _grants

    @property
    def grants(self) -> Mapping[str, bytes]:
        if self._grants is not None:
            return self._grants
        return self.book.keys if self.book is not None else {}

    def snapshot(self) -> AccountKeys:
        """These keys as they are now (a revocation later does not change them)."""
        return AccountKeys(self.keyring, None, dict(self.grants))

    def pinned(self, key_id: str | None) -> AccountKeys:
        """The keyring and, when granted, the key of ``key_id`` as it is now: what a reply
        seals with until its final write, even if the grant is revoked meanwhile (§6.4:
        "a reply already running may finish"). O(1), taken at every claim."""
        grants = self.grants
        if key_id is None or key_id in self.keyring or key_id not in grants:
            return AccountKeys(self.keyring, None, {})
        return AccountKeys(self.keyring, None, {key_id: grants[key_id]})

    def __getitem__(self, key_id: str) -> bytes:
        if key_id in self.keyring:
            return self.keyring[key_id]
        try:
            return self.grants[key_id]
        except KeyError:
            raise UnknownKeyError(f"keyId {key_id!r} is neither in the keyring nor granted to this bridge: "
                                  "the app has not granted it (or revoked it), or add it to the keyring file") from None

    def __contains__(self, key_id: object) -> bool:
        return key_id in self.keyring or key_id in self.grants

    def __iter__(self) -> Iterator[str]:
        yield from self.keyring
        yield from (k for k in self.grants if k not in self.keyring)

    def __len__(self) -> int:
        return len(self.keyring) + sum(1 for k in self.grants if k not in self.keyring)

    def __repr__(self) -> str:
        return f"AccountKeys(keyring={len(self.keyring)} key(s), granted={len(self.grants)})"

    __str__ = __repr__
