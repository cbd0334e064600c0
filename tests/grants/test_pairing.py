"""The app's side of key grants (gelbridge._pairing): which bridge record to trust, the pin
file, and the grant record, which a bridge honours and nothing else opens."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gelbridge._errors import PairingError
from gelbridge._grants import GRANT_SCHEME, BridgeKey, BridgeKeys, read_grant
from gelbridge._pairing import (
    BridgeOffer,
    Pin,
    PinFile,
    bridge_offers,
    choose_bridge,
    grant_record,
    pins_path,
    read_bridge_record,
)

DID = "did:plc:abcdefghijklmnopqrstuvwx"
NOW = "2026-12-03T12:00:00.000Z"


def offer(key: BridgeKey) -> BridgeOffer:
    found = read_bridge_record(key.kid, key.record_value(NOW))
    assert found is not None
    return found


def test_a_bridge_record_in_either_form_is_an_offer_and_a_bad_one_is_not() -> None:
    key = BridgeKey.generate(kid="b-1", name="team")
    got = offer(key)
    assert got == BridgeOffer("b-1", key.public_key, "team") and got.fingerprint == key.fingerprint
    raw = {**key.record_value(NOW), "publicKey": key.public_key}  # the firehose's raw bytes
    assert read_bridge_record("b-1", raw) == got
    assert got.label == f'b-1 "team" (fingerprint {key.fingerprint})'
    bad = [("b-1", {**key.record_value(NOW), "scheme": "other"}),
           ("b-1", {**key.record_value(NOW), "publicKey": {"$bytes": "AAAA"}}),
           ("b-1", {**key.record_value(NOW), "publicKey": "not bytes"}),
           ("b/1", key.record_value(NOW)), ("b-1", ["not", "a", "record"])]
    for rkey, value in bad:
        assert read_bridge_record(rkey, value) is None
    assert bridge_offers([*bad, ("b-2", BridgeKey.generate(kid="b-2").record_value(NOW)),
                          ("b-1", key.record_value(NOW))])[0] == got  # sorted by kid, bad ones dropped


def test_choose_the_only_bridge_the_wanted_one_or_the_pinned_one() -> None:
    a, b = offer(BridgeKey.generate(kid="b-a")), offer(BridgeKey.generate(kid="b-b"))
    assert choose_bridge([a], pinned=None) == a
    assert choose_bridge([a, b], pinned=None, want="b-b") == b
    assert choose_bridge([a, b], pinned=Pin("b-a", a.public_key)) == a  # rotation: the pin still stands
    with pytest.raises(PairingError, match="no bridge key is published"):
        choose_bridge([], pinned=None)
    with pytest.raises(PairingError, match="2 bridge keys are published.*--bridge KID") as e:
        choose_bridge([a, b], pinned=None)
    assert a.fingerprint in str(e.value) and b.fingerprint in str(e.value)
    with pytest.raises(PairingError, match="no bridge key 'b-c' is published"):
        choose_bridge([a, b], pinned=None, want="b-c")


def test_a_changed_or_gone_pinned_key_is_refused_until_repinned() -> None:
    a = offer(BridgeKey.generate(kid="b-a"))
    impostor = offer(BridgeKey.generate(kid="b-a"))
    b = offer(BridgeKey.generate(kid="b-b"))
    pin = Pin("b-a", a.public_key)
    with pytest.raises(PairingError, match="CHANGED") as e:
        choose_bridge([impostor], pinned=pin)
    assert a.fingerprint in str(e.value) and impostor.fingerprint in str(e.value) and "--repin" in str(e.value)
    assert choose_bridge([impostor], pinned=pin, repin=True) == impostor
    with pytest.raises(PairingError, match="no longer published.*--repin"):
        choose_bridge([b], pinned=pin)
    assert choose_bridge([b], pinned=pin, repin=True) == b
    with pytest.raises(PairingError, match="pinned to bridge key b-a.*--repin"):
        choose_bridge([a, b], pinned=pin, want="b-b")
    assert choose_bridge([a, b], pinned=pin, want="b-b", repin=True) == b


def test_the_pin_file_is_private_round_trips_and_refuses_damage(tmp_path: Path) -> None:
    path = pins_path(tmp_path / "keys" / "app.json")
    assert path == tmp_path / "keys" / "app.pins.json"
    pins = PinFile.load(path)
    assert pins.get(DID) is None
    a = offer(BridgeKey.generate(kid="b-a"))
    pins.pin(DID, a)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["pins"][DID]["fingerprint"] == a.fingerprint
    assert PinFile.load(path).get(DID) == Pin("b-a", a.public_key)
    doc["pins"][DID]["fingerprint"] = "0000-0000-0000-0000-0000-0000"  # edited by hand: does not match
    path.write_text(json.dumps(doc))
    with pytest.raises(PairingError, match="damaged"):
        PinFile.load(path)
    for text in ("not json", '{"pins": 3}', '{"pins": {"x": {"kid": "b/a"}}}'):
        path.write_text(text)
        with pytest.raises(PairingError, match="damaged"):
            PinFile.load(path)


def test_a_grant_record_is_honoured_by_its_bridge_only_where_it_was_written() -> None:
    bridge = BridgeKey.generate(kid="b-a")
    other = BridgeKey.generate(kid="b-a")
    key = os.urandom(32)
    value = grant_record(key, key_id="k-1", bridge=offer(bridge), did=DID, rkey="3mbd3aaaaaaa2", created_at=NOW)
    assert value["scheme"] == GRANT_SCHEME and value["recipient"] == "b-a" and value["keyId"] == "k-1"
    assert key.hex() not in json.dumps(value)
    v = read_grant(value, did=DID, rkey="3mbd3aaaaaaa2", bridge=BridgeKeys([bridge]))
    assert v.honoured and v.key == key
    assert read_grant(value, did=DID, rkey="3mbd3aaaaaaa3", bridge=BridgeKeys([bridge])).code == "sealed_key"
    assert read_grant(value, did="did:plc:other", rkey="3mbd3aaaaaaa2", bridge=BridgeKeys([bridge])).code \
        == "sealed_key"
    assert read_grant(value, did=DID, rkey="3mbd3aaaaaaa2", bridge=BridgeKeys([other])).code == "sealed_key"


def test_a_fingerprint_given_by_the_operator_picks_the_key_and_overrides_the_pin() -> None:
    a, b = offer(BridgeKey.generate(kid="b-a")), offer(BridgeKey.generate(kid="b-b"))
    assert choose_bridge([a, b], pinned=None, fingerprint=b.fingerprint.upper() + " ") == b
    assert choose_bridge([a, b], pinned=Pin("b-a", a.public_key), fingerprint=b.fingerprint) == b  # checked
    with pytest.raises(PairingError, match="no bridge key with fingerprint 0000.*Nothing was sent"):
        choose_bridge([a, b], pinned=None, fingerprint="0000-0000-0000-0000-0000-0000")
    with pytest.raises(PairingError, match="as b-a"):
        choose_bridge([a, b], pinned=None, want="b-a", fingerprint=b.fingerprint)
