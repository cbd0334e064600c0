"""The app's side of key grants (PROTOCOL.md §6): which bridge to grant conversation keys
to, trust on first use, and the grant record itself.

Pure except for reading and writing the pin file. An app pins the bridge key it first
grants to (per account DID) in ``<keyring stem>.pins.json`` beside the user's keyring;
from then on a bridge record whose key differs from the pin, or a pinned key no longer
published, is refused until the user checks the new fingerprint and re-pins. That is
what stops someone who can write to the repo from slipping in a key of their own.

- :func:`bridge_offers`: the valid ``chat.gel.assistant.bridge`` records of a repo.
- :func:`choose_bridge`: the one to grant to, given the pin, ``--bridge`` and ``--repin``.
- :func:`grant_record`: a ``chat.gel.assistant.keyGrant`` record for one key.
- :class:`PinFile`: the pins, one per account.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gelbridge._errors import KeyringError, PairingError
from gelbridge._grants import GRANT_SCHEME, bytes_field, check_kid, fingerprint, grant_uri, seal_key
from gelbridge._records import nesting
from gelbridge._records.codec import b64encode
from gelbridge._records.constants import KEY_GRANT_COLLECTION
from gelbridge._sealing import write_private_file

_PUBLIC_KEY_BYTES = 32


@dataclass(frozen=True)
class BridgeOffer:
    """A bridge key published in a repo (a valid ``chat.gel.assistant.bridge`` record)."""

    kid: str
    public_key: bytes = field(repr=False)
    name: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    @property
    def label(self) -> str:
        """``kid "name" (fingerprint …)``: what a person compares with the operator's."""
        named = f" {json.dumps(self.name, ensure_ascii=False)}" if self.name else ""
        return f"{self.kid}{named} (fingerprint {self.fingerprint})"


def read_bridge_record(rkey: str, value: Any) -> BridgeOffer | None:
    """The offer in one bridge record, or None when it is not one an app may use (an
    unknown scheme, a key that is not 32 bytes, a bad kid)."""
    if not isinstance(value, Mapping) or value.get("scheme") != GRANT_SCHEME:
        return None
    pub = bytes_field(value.get("publicKey"))
    if pub is None or len(pub) != _PUBLIC_KEY_BYTES:
        return None
    try:
        check_kid(rkey)
    except KeyringError:
        return None
    name = value.get("name")
    return BridgeOffer(rkey, pub, name if isinstance(name, str) and len(name.encode()) <= 64 else None)


def bridge_offers(records: Iterable[tuple[str, Any]]) -> list[BridgeOffer]:
    """The usable offers among ``(rkey, value)`` bridge records, by kid."""
    offers = [o for rkey, value in records if (o := read_bridge_record(rkey, value)) is not None]
    return sorted(offers, key=lambda o: o.kid)


@dataclass(frozen=True)
class Pin:
    """The bridge key an app trusts for one account."""

    kid: str
    public_key: bytes = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)


def choose_bridge(offers: list[BridgeOffer], *, pinned: Pin | None, want: str | None = None,
                  repin: bool = False, fingerprint: str | None = None) -> BridgeOffer:
    """The bridge to grant keys to: ``want`` (``--bridge KID``), else the pinned one, else
    the only one. A pinned key that changed or is gone is refused (PairingError saying what
    to check) unless ``repin``; so is a choice of another kid than the pinned one.

    ``fingerprint`` (``--fingerprint``, as the operator gave it): only the key with that
    fingerprint is taken, pin or no pin: the user checked it, which is what ``repin`` asks."""
    if fingerprint is not None:
        return _by_fingerprint(offers, fingerprint, want)
    trust = pinned if not repin else None
    kid = want or (trust.kid if trust is not None else None)
    if kid is not None:
        offer = next((o for o in offers if o.kid == kid), None)
        if offer is None and trust is not None and want is None:
            raise PairingError(_gone(trust, offers))
        if offer is None:
            raise PairingError(f"no bridge key {kid!r} is published in this repo; {_listing(offers)}")
    elif not offers:
        raise PairingError("no bridge key is published in this repo: is a gelbridge with [keyring] bridge_key "
                           "serving this account? (it publishes its key when it starts)")
    elif len(offers) > 1:
        raise PairingError(f"{len(offers)} bridge keys are published in this repo; choose one with --bridge KID "
                           f"after checking its fingerprint with the bridge's operator: {_listing(offers)}")
    else:
        offer = offers[0]
    if trust is not None:
        _check_pin(offer, trust)
    return offer


def _by_fingerprint(offers: list[BridgeOffer], fingerprint: str, want: str | None) -> BridgeOffer:
    fp = fingerprint.strip().lower()
    for o in offers:
        if o.fingerprint == fp and (want is None or o.kid == want):
            return o
    named = f" as {want}" if want else ""
    raise PairingError(f"no bridge key with fingerprint {fp} is published in this repo{named}; {_listing(offers)}. "
                       "Nothing was sent: check the fingerprint 'gelbridge keys bridge-show' prints with the "
                       "bridge's operator")


def _check_pin(offer: BridgeOffer, pin: Pin) -> None:
    if offer.kid != pin.kid:
        raise PairingError(f"this account is pinned to bridge key {pin.kid} (fingerprint {pin.fingerprint}), "
                           f"not {offer.label}: to switch, check the new fingerprint with the bridge's operator "
                           "and run again with --repin")
    if offer.public_key != pin.public_key:
        raise PairingError(
            f"WARNING: the bridge key {pin.kid} CHANGED: pinned fingerprint {pin.fingerprint}, the repo now "
            f"publishes {offer.fingerprint}. Someone who can write to this repo may be trying to read your "
            "chats. Nothing was sent. If the bridge's operator really replaced the key, check the new "
            "fingerprint with them ('gelbridge keys bridge-show') and run again with --repin.")


def _gone(pin: Pin, offers: list[BridgeOffer]) -> str:
    return (f"the bridge key you pinned, {pin.kid} (fingerprint {pin.fingerprint}), is no longer published in "
            f"this repo; {_listing(offers)}. Nothing was sent. If the bridge's operator retired it, check the "
            "new fingerprint with them and run again with --repin (and --bridge KID if there are several).")


def _listing(offers: list[BridgeOffer]) -> str:
    if not offers:
        return "the repo publishes none"
    return "the repo publishes " + ", ".join(o.label for o in offers)


def grant_record(key: bytes, *, key_id: str, bridge: BridgeOffer, did: str, rkey: str,
                 created_at: str) -> dict[str, Any]:
    """The ``chat.gel.assistant.keyGrant`` record (JSON form) that gives ``key`` to
    ``bridge``, sealed for the record ``at://did/…keyGrant/rkey`` and nowhere else."""
    sealed = seal_key(key, public_key=bridge.public_key, uri=grant_uri(did, rkey), key_id=key_id,
                      recipient=bridge.kid)
    return {"$type": KEY_GRANT_COLLECTION, "scheme": GRANT_SCHEME, "recipient": bridge.kid, "keyId": key_id,
            "sealedKey": {"$bytes": b64encode(sealed)}, "createdAt": created_at}


# --- the pin file ---------------------------------------------------------------------------


def pins_path(keyring_path: Path) -> Path:
    """``<keyring stem>.pins.json`` beside the keyring file."""
    p = keyring_path.expanduser()
    return p.with_name(f"{p.stem}.pins.json")


@dataclass
class PinFile:
    """Pinned bridge keys by account DID. File form (mode 0600):
    ``{"pins": {"<did>": {"kid", "publicKey": base64, "fingerprint", "name"?}}}``; the
    fingerprint is there for people reading the file, and checked against the key."""

    path: Path
    pins: dict[str, Pin] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> PinFile:
        """The pins in ``path`` (none when it does not exist yet)."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as e:
            raise PairingError(f"cannot read the pin file {path}: {getattr(e, 'strerror', None) or e}") from None
        try:
            data = nesting.loads(text)
            return cls(path, {did: _pin_of(entry) for did, entry in data["pins"].items()})
        except (ValueError, KeyError, TypeError, AttributeError, KeyringError):
            raise PairingError(f"the pin file {path} is damaged: fix it, or move it away and pin the bridge "
                               "again (check its fingerprint with the bridge's operator)") from None

    def get(self, did: str) -> Pin | None:
        return self.pins.get(did)

    def pin(self, did: str, offer: BridgeOffer) -> None:
        """Pin ``offer`` for ``did`` and write the file (atomically, 0600)."""
        self.pins[did] = Pin(offer.kid, offer.public_key)
        doc = {"pins": {d: {"kid": p.kid, "publicKey": base64.b64encode(p.public_key).decode(),
                            "fingerprint": p.fingerprint} for d, p in sorted(self.pins.items())}}
        write_private_file(self.path, (json.dumps(doc, indent=2) + "\n").encode())


def _pin_of(entry: Any) -> Pin:
    pub = base64.b64decode(entry["publicKey"], validate=True)
    kid = check_kid(entry["kid"])
    if len(pub) != _PUBLIC_KEY_BYTES or entry.get("fingerprint") != fingerprint(pub):
        raise ValueError("pin does not match its key")
    return Pin(kid, pub)

