"""Sealing (PROTOCOL.md §2, scheme ``xchacha20poly1305-v1``) and the keyring.

A sealed value is an ``encryptedContent``: XChaCha20-Poly1305 (IETF) over the UTF-8
JSON of the value in atproto JSON form, with associated data
``scheme + "\\n" + uri + "\\n" + keyId`` binding it to the record that holds it.
Encrypted blobs are ``nonce ‖ AEAD`` with associated data ``scheme + "\\nblob\\n" + keyId``.

Nothing here logs, and no error message contains key bytes or plaintext.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
import secrets
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from gelbridge._errors import (
    KEYRING_ENV,
    DecryptError,
    GelbridgeError,
    KeyringError,
    MalformedSealError,
    MovedCiphertextError,
    RecordError,
    SealingError,
    UnknownKeyError,
    UnknownSchemeError,
)
from gelbridge._records import nesting
from gelbridge._records.codec import b64decode, bytes_json
from gelbridge._records.keys import AtUri
from gelbridge._records.models import (
    ConversationRecord,
    EncryptedContent,
    MessageRecord,
    PlainContent,
    ReasoningPart,
    RecordModel,
    SourcePart,
    TextPart,
    ToolApprovalPart,
    ToolCallPart,
    ToolResultPart,
    parse_record,
    record_error,
)
from gelbridge._records.nesting import MAX_DEPTH, check_value, may_exceed

if TYPE_CHECKING:
    from gelbridge._config import Settings

SCHEME: Final = "xchacha20poly1305-v1"
KEY_BYTES: Final = 32
NONCE_BYTES: Final = 24
TAG_BYTES: Final = 16


def key_advice(path: str | os.PathLike[str]) -> str:
    """What to do about a keyring file that is missing or empty: the key the chat app
    shares goes in it; a new key only when starting fresh (the app must then get it)."""
    shape = '{"keys": {"<keyId>": "<base64 key>"}}'
    return (f"save the key your chat app shares in it as {shape}; only when starting fresh, make a new "
            f"one with 'gelbridge keys new --keyring {path}' (and give it to the chat app)")


_KEY_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def check_key_id(key_id: str) -> str:
    """Return ``key_id`` if it is 1-128 characters of ``A-Za-z0-9._:-``; else KeyringError."""
    if not isinstance(key_id, str) or not _KEY_ID_RE.fullmatch(key_id):
        raise KeyringError(
            f"invalid keyId {key_id!r}: use 1-128 characters of A-Za-z0-9 . _ : -"
        )
    return key_id


# --- keyring ---------------------------------------------------------------------------------


class Keyring(Mapping[str, bytes]):
    """Named 32-byte keys. File form: ``{"keys": {"<keyId>": "<base64 of 32 bytes>"}}``.

    ``repr``/``str`` show key ids only, never key bytes.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, bytes] | None = None) -> None:
        self._keys: dict[str, bytes] = {}
        for key_id, key in (keys or {}).items():
            check_key_id(key_id)
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise KeyringError(f"key {key_id!r} must be exactly {KEY_BYTES} bytes")
            self._keys[key_id] = key

    # Mapping interface
    def __getitem__(self, key_id: str) -> bytes:
        try:
            return self._keys[key_id]
        except KeyError:
            raise UnknownKeyError(
                f"keyId {key_id!r} is not in the keyring: add that key to the keyring file"
            ) from None

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Keyring(key_ids={sorted(self._keys)!r})"

    __str__ = __repr__

    @classmethod
    def parse(cls, data: Any, *, source: str = "keyring") -> Keyring:
        """Build a keyring from the decoded JSON of a keyring file."""
        if not isinstance(data, dict) or not isinstance(data.get("keys"), dict):
            raise KeyringError(f'{source}: expected {{"keys": {{"<keyId>": "<base64 key>"}}}}')
        keys: dict[str, bytes] = {}
        for key_id, text in data["keys"].items():
            check_key_id(key_id)
            if not isinstance(text, str):
                raise KeyringError(f"{source}: key {key_id!r} must be a base64 string")
            try:
                key = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise KeyringError(f"{source}: key {key_id!r} is not standard base64") from None
            if len(key) != KEY_BYTES:
                raise KeyringError(
                    f"{source}: key {key_id!r} is {len(key)} bytes, expected {KEY_BYTES}"
                )
            keys[key_id] = key
        return cls(keys)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Keyring:
        """Read a keyring file; KeyringError says what is wrong with it."""
        p = Path(path).expanduser()
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise KeyringError(f"keyring file {p} is not UTF-8 text") from None
        except FileNotFoundError:
            raise KeyringError(f"keyring file {p} does not exist: check the path, or {key_advice(p)}") from None
        except OSError as e:
            raise KeyringError(f"cannot read keyring file {p}: {e.strerror}") from None
        try:
            data = nesting.loads(text)
        except ValueError:
            raise KeyringError(f"keyring file {p} is not valid JSON") from None
        return cls.parse(data, source=f"keyring file {p}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """Load the keyring named by ``$GELBRIDGE_KEYRING`` (a file path)."""
        env = os.environ if environ is None else environ
        path = env.get(KEYRING_ENV)
        if not path:
            raise KeyringError(f"no keyring: set {KEYRING_ENV} to the path of a keyring file")
        return cls.load(path)

    def add_new(self, key_id: str | None = None) -> str:
        """Add a fresh random key and return its id (generated when not given)."""
        if key_id is None:
            key_id = "k-" + secrets.token_hex(8)
        check_key_id(key_id)
        if key_id in self._keys:
            raise KeyringError(f"keyId {key_id!r} is already in the keyring: choose another id")
        self._keys[key_id] = secrets.token_bytes(KEY_BYTES)
        return key_id

    def to_json(self) -> dict[str, Any]:
        """The file form. Holds key bytes: write it only to the keyring file."""
        # The keyring file keeps standard padded base64 (its own format, not atproto ``$bytes``).
        return {"keys": {k: base64.b64encode(v).decode("ascii") for k, v in self._keys.items()}}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the keyring file atomically with mode 0600."""
        write_private_file(Path(path), (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode())


def write_private_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (a temporary file, fsync, rename), mode
    0600 from its first byte: a reader sees the old file or the new one, never half."""
    p = path.expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def load_keyring(settings: Settings, environ: Mapping[str, str] | None = None) -> Keyring:
    """``[keyring] path`` (or ``$GELBRIDGE_KEYRING``)."""
    if settings.keyring.path is not None:
        return Keyring.load(settings.keyring.path)
    return Keyring.from_env(environ)


# --- values -------------------------------------------------------------------------------------


def _ad(uri: str, key_id: str) -> bytes:
    return f"{SCHEME}\n{uri}\n{key_id}".encode()


def _blob_ad(key_id: str) -> bytes:
    return f"{SCHEME}\nblob\n{key_id}".encode()


def _json_default(o: Any) -> Any:
    # Only bytes, never the CID guess of ``to_json_form``: sealed bytes are data, not links.
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes_json(bytes(o))
    raise TypeError(f"value of type {type(o).__name__} cannot be sealed as JSON")


@functools.lru_cache(maxsize=4096)
def _checked_uri(uri: str) -> str:
    # AT-URI parsing costs ~5 µs; a reply is sealed many times while it streams
    return str(AtUri.parse(uri))


def _uri_str(uri: str | AtUri) -> str:
    if isinstance(uri, AtUri):
        return str(uri)
    if type(uri) is str:
        return _checked_uri(uri)
    return str(AtUri.parse(uri))


def _seal_key(key_id: str, keyring: Mapping[str, bytes]) -> bytes:
    """The key to seal with; KeyringError for an invalid id, UnknownKeyError if absent."""
    if type(keyring) is Keyring:
        key = keyring._keys.get(key_id)  # a Keyring holds only checked ids
        if key is not None:
            return key
    check_key_id(key_id)
    return _key(keyring, key_id)


try:  # libsodium directly: PyNaCl's binding adds ~half the cost of a small encrypt/decrypt
    from nacl._sodium import ffi as _ffi
    from nacl._sodium import lib as _lib

    _raw_decrypt = _lib.crypto_aead_xchacha20poly1305_ietf_decrypt
    _raw_encrypt = _lib.crypto_aead_xchacha20poly1305_ietf_encrypt
    _from_buffer = _ffi.from_buffer
    _NULL = _ffi.NULL
except (ImportError, AttributeError):  # pragma: no cover - other PyNaCl layouts
    _raw_decrypt = _raw_encrypt = _from_buffer = _NULL = None


def _encrypt(plaintext: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytes:
    """AEAD seal: ciphertext ‖ tag."""
    if _raw_encrypt is not None and len(key) == KEY_BYTES and len(nonce) == NONCE_BYTES:
        # the output written straight into a bytearray; clen_p may be NULL in libsodium
        # (the length is always len(plaintext) + tag), nsec is unused and must be NULL
        out = bytearray(len(plaintext) + TAG_BYTES)
        rc = _raw_encrypt(_ffi.from_buffer(out), _ffi.NULL, plaintext, len(plaintext),
                          ad, len(ad), _ffi.NULL, nonce, key)
        if rc == 0:
            return bytes(out)
    return crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, ad, nonce, key)


def _decrypt_into(ciphertext: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytearray | bytes | None:
    """AEAD open into a fresh bytearray (or bytes); None if authentication fails.

    Lengths are checked by the caller. The plaintext is not copied again: ``orjson``
    reads a bytearray as it is.
    """
    if _raw_decrypt is not None and len(key) == KEY_BYTES and len(nonce) == NONCE_BYTES and len(ciphertext) >= TAG_BYTES:
        mlen = len(ciphertext) - TAG_BYTES
        # mlen_p may be NULL in libsodium: the plaintext length is always len - tag
        out = bytearray(mlen or 1)
        rc = _raw_decrypt(_ffi.from_buffer(out), _ffi.NULL, _ffi.NULL, ciphertext, len(ciphertext),
                          ad, len(ad), nonce, key)
        if rc != 0:
            return None
        if not mlen:
            return b""
        return out
    try:
        return crypto_aead_xchacha20poly1305_ietf_decrypt(ciphertext, ad, nonce, key)
    except CryptoError:
        return None


def _decrypt(ciphertext: bytes, ad: bytes, nonce: bytes, key: bytes) -> bytes | None:
    """AEAD open; None if authentication fails. Lengths are checked by the caller."""
    out = _decrypt_into(ciphertext, ad, nonce, key)
    return out if out is None or type(out) is bytes else bytes(out)


_ENCRYPTED_VALIDATOR = EncryptedContent.__pydantic_validator__
_PLAIN_VALIDATOR = PlainContent.__pydantic_validator__
_PLAIN_TO_JSON = PlainContent.__pydantic_serializer__.to_json


def _new_sealed(key_id: str, nonce: bytes, ciphertext: bytes) -> EncryptedContent:
    # the compiled validator directly (what ``EncryptedContent(...)`` runs, minus ~0.5 µs)
    sealed: EncryptedContent = _ENCRYPTED_VALIDATOR.validate_python(
        {"scheme": SCHEME, "key_id": key_id, "nonce": nonce, "ciphertext": ciphertext}
    )
    return sealed


#: Parts whose fields are only strings, booleans and None (no nested model, no number).
_FLAT_PARTS: Final = frozenset({TextPart, ReasoningPart, ToolCallPart, ToolApprovalPart, SourcePart})


def _is_flat(content: PlainContent) -> bool:
    """True if ``content`` holds only strings, booleans and None below its parts.

    For such content pydantic's own JSON writer gives exactly the bytes ``orjson`` gives
    for ``to_value()`` (tests/sealing prove it), at a third of the cost; anything else
    (extras, blobs, unknown parts) may hold values the two treat differently.
    """
    if content.__pydantic_extra__:
        return False
    for p in content.parts:
        t = type(p)
        if t not in _FLAT_PARTS and (not isinstance(p, ToolResultPart) or p.output_blob is not None):
            return False
        if p.__pydantic_extra__:
            return False
    return True


def seal_value(
    value: dict[str, Any], *, uri: str | AtUri, key_id: str, keyring: Mapping[str, bytes]
) -> EncryptedContent:
    """Seal ``value`` (atproto JSON form; raw bytes become ``$bytes``) for record ``uri``."""
    uri_s = _uri_str(uri)
    key = _seal_key(key_id, keyring)
    try:
        plaintext = orjson.dumps(value, default=_json_default)
    except (TypeError, ValueError) as e:
        raise RecordError(f"cannot seal value for {uri_s}: {e}") from None
    nonce = secrets.token_bytes(NONCE_BYTES)
    return _new_sealed(key_id, nonce, _encrypt(plaintext, _ad(uri_s, key_id), nonce, key))


def _check_sealed(enc: EncryptedContent, keyring: Mapping[str, bytes]) -> bytes:
    if enc.scheme != SCHEME:
        raise UnknownSchemeError(
            f"unknown sealing scheme {enc.scheme!r}: gelbridge knows only {SCHEME!r}"
        )
    if len(enc.nonce) != NONCE_BYTES:
        raise MalformedSealError(
            f"nonce is {len(enc.nonce)} bytes, {SCHEME} needs {NONCE_BYTES}"
        )
    if len(enc.ciphertext) < TAG_BYTES:
        raise MalformedSealError(
            f"ciphertext is {len(enc.ciphertext)} bytes, shorter than the {TAG_BYTES}-byte tag"
        )
    return _key(keyring, enc.key_id)


def _key(keyring: Mapping[str, bytes], key_id: str) -> bytes:
    """``keyring[key_id]``; UnknownKeyError if absent, whatever the mapping's type."""
    if type(keyring) is Keyring:
        key = keyring._keys.get(key_id)
        if key is not None:
            return key
    try:
        return keyring[key_id]
    except KeyError:  # a plain mapping's lookup: the same error a Keyring raises
        raise UnknownKeyError(
            f"keyId {key_id!r} is not in the keyring: add that key to the keyring file"
        ) from None


def _try_open(enc: EncryptedContent, uri: str, key: bytes) -> bytes | None:
    return _decrypt(enc.ciphertext, _ad(uri, enc.key_id), enc.nonce, key)


class CopySources:
    """Which records a sealed value that fails to open may have been copied from: those
    holding the same nonce (a copy keeps its nonce and ciphertext; fresh seals never
    share one). Built once over a set of records, it makes reporting every copied or
    wrongly keyed value of the set linear: one extra decryption at most per failure,
    where trying every other record of the set was quadratic. Pass it as
    ``candidate_uris``."""

    __slots__ = ("_by_nonce",)

    def __init__(self, records: Iterable[tuple[str | AtUri, Mapping[str, Any]]]) -> None:
        by_nonce: dict[bytes, list[str]] = {}
        for uri, value in records:
            for field in ("content", "instructions"):
                sealed = value.get(field) if isinstance(value, Mapping) else None
                nonce = _raw_bytes(sealed.get("nonce")) if isinstance(sealed, Mapping) else None
                if nonce is not None:
                    by_nonce.setdefault(nonce, []).append(str(uri))
        self._by_nonce = by_nonce

    def candidates(self, enc: EncryptedContent) -> list[str]:
        return self._by_nonce.get(enc.nonce, [])


def _raw_bytes(value: Any) -> bytes | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, Mapping) and isinstance(value.get("$bytes"), str):
        try:
            return b64decode(value["$bytes"])
        except ValueError:
            return None
    return None


def _open_failed(enc: EncryptedContent, uri_s: str, key: bytes,
                 candidate_uris: Iterable[str | AtUri] | CopySources) -> SealingError:
    """Why ``enc`` does not open for ``uri_s``: copied from a candidate, or not at all."""
    if isinstance(candidate_uris, CopySources):
        candidate_uris = candidate_uris.candidates(enc)
    for cand in candidate_uris:
        cand_s = str(cand)
        if cand_s != uri_s and _try_open(enc, cand_s, key) is not None:
            err = MovedCiphertextError(
                f"sealed content in {uri_s} was sealed for another record, {cand_s}: "
                "it was copied and is not accepted here"
            )
            err.belongs_to = cand_s  # type: ignore[attr-defined]
            return err
    return DecryptError(
        f"cannot open sealed content of {uri_s} with key {enc.key_id!r}: "
        "the key is wrong or the record was changed"
    )


def open_bytes(
    enc: EncryptedContent,
    *,
    uri: str | AtUri,
    keyring: Mapping[str, bytes],
    candidate_uris: Iterable[str | AtUri] | CopySources = (),
) -> bytes:
    """The authenticated plaintext bytes of ``enc`` sealed for ``uri``.

    On failure each of ``candidate_uris`` is tried: if the ciphertext opens for one of
    them it was copied from that record (MovedCiphertextError names it); otherwise the
    key is wrong or the data was changed (DecryptError).
    """
    uri_s = str(uri)
    key = _check_sealed(enc, keyring)
    plaintext = _try_open(enc, uri_s, key)
    if plaintext is None:
        raise _open_failed(enc, uri_s, key, candidate_uris)
    return plaintext


def _loads_object(plaintext: bytes | bytearray, uri: str | AtUri) -> dict[str, Any]:
    try:
        value = orjson.loads(plaintext)
    except orjson.JSONDecodeError:
        if may_exceed(plaintext, 1024):  # orjson's own limit
            raise RecordError(f"sealed content of {uri} is nested deeper than {MAX_DEPTH} levels "
                              "(gelbridge's limit)") from None
        raise RecordError(f"sealed content of {uri} is not UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise RecordError(f"sealed content of {uri} is not a JSON object")
    if may_exceed(plaintext):
        check_value(value, f"sealed content of {uri}")
    return value


def open_value(
    enc: EncryptedContent,
    *,
    uri: str | AtUri,
    keyring: Mapping[str, bytes],
    candidate_uris: Iterable[str | AtUri] | CopySources = (),
) -> dict[str, Any]:
    """Open ``enc`` (sealed for ``uri``) and return the sealed JSON object."""
    return _loads_object(open_bytes(enc, uri=uri, keyring=keyring, candidate_uris=candidate_uris), uri)


def open_content(
    enc: EncryptedContent,
    *,
    uri: str | AtUri,
    keyring: Mapping[str, bytes],
    candidate_uris: Iterable[str | AtUri] | CopySources = (),
) -> PlainContent:
    """Open ``enc`` and validate it as a ``plainContent``.

    What ``PlainContent.from_value(open_value(...))`` does, in one frame: this runs for
    every message of a thread.
    """
    uri_s = uri if type(uri) is str else str(uri)
    ct, nonce, key_id = enc.ciphertext, enc.nonce, enc.key_id
    mlen = len(ct) - TAG_BYTES
    if (
        type(keyring) is Keyring
        and mlen > 0
        and len(nonce) == NONCE_BYTES
        and enc.scheme == SCHEME
        and _raw_decrypt is not None
        and (key := keyring._keys.get(key_id)) is not None  # a Keyring holds only 32-byte keys
    ):
        # the usual case in this frame: what _check_sealed + _decrypt_into do, minus two
        # calls and their repeated length checks (~0.5-1 µs of a ~10 µs open)
        out = bytearray(mlen)
        ad = f"{SCHEME}\n{uri_s}\n{key_id}".encode()
        ok = _raw_decrypt(_from_buffer(out), _NULL, _NULL, ct, len(ct), ad, len(ad), nonce, key) == 0
        plaintext: bytes | bytearray | None = out if ok else None
    else:
        key = _check_sealed(enc, keyring)  # raises what is wrong with the seal or the key
        plaintext = _decrypt_into(ct, _ad(uri_s, key_id), nonce, key)
    if plaintext is None:
        raise _open_failed(enc, uri_s, key, candidate_uris)
    # orjson, not ``_PLAIN_VALIDATOR.validate_json``: pydantic's parser accepts NaN,
    # Infinity and numbers beyond double range (also in an overwritten duplicate key) and
    # reads integers beyond 64 bits differently (tests/sealing/test_open_strictness.py).
    # It saves 2-4 µs a message, but every exact guard tried (no backslash + counted
    # quotes or the compact length of the result) cost more than that.
    try:
        value = orjson.loads(plaintext)
    except orjson.JSONDecodeError:
        value = None
    if type(value) is not dict or may_exceed(plaintext):
        value = _loads_object(plaintext, uri)  # raises the RecordError saying what is wrong
    try:
        opened: PlainContent = _PLAIN_VALIDATOR.validate_python(value, by_alias=True, by_name=False)
        return opened
    except ValidationError as e:
        raise record_error(e, f"record {uri} (sealed content)") from None


def plaintext_size(content: PlainContent) -> int:
    """How many bytes :func:`seal_content` would seal for ``content`` (its JSON), by the
    same fast path; RecordError if it cannot be sealed at all."""
    if _is_flat(content):
        try:
            return len(_PLAIN_TO_JSON(content, by_alias=True, exclude_none=True))
        except PydanticSerializationError:
            pass
    try:
        return len(orjson.dumps(content.to_value(), default=_json_default))
    except (TypeError, ValueError) as e:
        raise RecordError(f"content cannot be sealed: {type(e).__name__}") from None


def seal_content(
    content: PlainContent, *, uri: str | AtUri, key_id: str, keyring: Mapping[str, bytes]
) -> EncryptedContent:
    """Seal a plainContent (``$type`` and every part's ``$type`` included) for ``uri``."""
    if not _is_flat(content):
        return seal_value(content.to_value(), uri=uri, key_id=key_id, keyring=keyring)
    uri_s = _uri_str(uri)
    key = _seal_key(key_id, keyring)
    try:
        plaintext = _PLAIN_TO_JSON(content, by_alias=True, exclude_none=True)
    except PydanticSerializationError:  # e.g. a lone surrogate: the exact path says why
        return seal_value(content.to_value(), uri=uri, key_id=key_id, keyring=keyring)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return _new_sealed(key_id, nonce, _encrypt(plaintext, _ad(uri_s, key_id), nonce, key))


def content_of(
    content: EncryptedContent | PlainContent,
    *,
    uri: str | AtUri,
    keyring: Mapping[str, bytes] | None,
    candidate_uris: Iterable[str | AtUri] | CopySources = (),
) -> PlainContent:
    """The plain parts of a ``content``/``instructions`` union: opened if sealed."""
    if type(content) is EncryptedContent and keyring is not None:
        return open_content(content, uri=uri, keyring=keyring, candidate_uris=candidate_uris)
    if isinstance(content, PlainContent):
        return content
    if keyring is None:
        raise KeyringError(f"{uri} holds sealed content and no keyring was given")
    return open_content(content, uri=uri, keyring=keyring, candidate_uris=candidate_uris)


# --- blobs ------------------------------------------------------------------------------------


def seal_blob(data: bytes, *, key_id: str, keyring: Mapping[str, bytes]) -> bytes:
    """Encrypt a blob body: ``nonce ‖ AEAD(data)``, to upload as application/octet-stream."""
    check_key_id(key_id)
    key = _key(keyring, key_id)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + crypto_aead_xchacha20poly1305_ietf_encrypt(bytes(data), _blob_ad(key_id), nonce, key)


def open_blob(body: bytes, *, key_id: str, keyring: Mapping[str, bytes]) -> bytes:
    """Decrypt a blob body made by :func:`seal_blob`."""
    key = _key(keyring, key_id)
    if len(body) < NONCE_BYTES + TAG_BYTES:
        raise MalformedSealError(
            f"encrypted blob is {len(body)} bytes, shorter than nonce and tag ({NONCE_BYTES + TAG_BYTES})"
        )
    try:
        return crypto_aead_xchacha20poly1305_ietf_decrypt(
            bytes(body[NONCE_BYTES:]), _blob_ad(key_id), bytes(body[:NONCE_BYTES]), key
        )
    except CryptoError:
        raise DecryptError(
            f"cannot open encrypted blob with key {key_id!r}: the key is wrong or the blob was changed"
        ) from None


# --- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenedRecord:
    """One record with its sealed field opened, or the reason it could not be."""

    uri: AtUri
    cid: str | None
    value: dict[str, Any]
    record: RecordModel | None = None
    content: PlainContent | None = None
    error: GelbridgeError | None = None

    def opened_value(self) -> dict[str, Any]:
        """The record value with its sealed ``content``/``instructions`` replaced by the plainContent."""
        if self.record is None:
            return self.value
        out = self.record.to_value()
        if self.content is not None:
            field = "instructions" if isinstance(self.record, ConversationRecord) else "content"
            out[field] = self.content.to_value()
        return out


def open_record(
    uri: AtUri,
    cid: str | None,
    value: dict[str, Any],
    *,
    keyring: Mapping[str, bytes] | None,
    candidate_uris: Iterable[str | AtUri] | CopySources = (),
) -> OpenedRecord:
    """Parse one chat.gel.assistant record and open its sealed field; errors are returned."""
    try:
        record = parse_record(uri.collection, value, uri=str(uri))
    except GelbridgeError as e:
        return OpenedRecord(uri, cid, value, error=e)
    sealed = None
    if isinstance(record, MessageRecord):
        sealed = record.content
    elif isinstance(record, ConversationRecord):
        sealed = record.instructions
    if sealed is None:
        return OpenedRecord(uri, cid, value, record=record)
    try:
        content = content_of(sealed, uri=uri, keyring=keyring, candidate_uris=candidate_uris)
    except GelbridgeError as e:
        return OpenedRecord(uri, cid, value, record=record, error=e)
    return OpenedRecord(uri, cid, value, record=record, content=content)
