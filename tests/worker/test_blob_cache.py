"""The opened blobs an account keeps between turns are bounded in bytes, not only in number:
64 blobs of 5 MiB each (the largest the PDS client reads) would be 320 MiB per account."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from types import SimpleNamespace

from gelbridge._config import Settings
from gelbridge._records import BlobRef, ExtractedText, FilePart
from gelbridge._records.codec import cid_str
from gelbridge._sealing import Keyring, seal_blob
from gelbridge._worker.turn import _blobs_for, keep_blob
from testkit.mapping_builders import opened, user

MiB = 1024 * 1024


class BlobPds:
    """get_blob from a dict of sealed blobs, counting the fetches."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.fetches = 0

    async def get_blob(self, did: str, cid: str) -> bytes:
        self.fetches += 1
        return self.blobs[cid]


def raw_cid(data: bytes) -> str:
    return cid_str(b"\x01\x55\x12\x20" + hashlib.sha256(data).digest())  # CIDv1, raw, sha-256


async def test_the_cache_keeps_at_most_twice_the_request_bound_of_blobs_across_turns() -> None:
    keyring = Keyring()
    kid = keyring.add_new("k")
    pds = BlobPds()
    settings = Settings.model_validate({"thread": {"max_request_bytes": 4 * MiB}})
    deps = SimpleNamespace(settings=settings, pds=pds, did="did:plc:x", keyring=keyring, blob_cache=OrderedDict())
    for turn in range(6):  # each turn: three new 1 MiB files (3 MiB, under the 4 MiB a request may hold)
        parts = []
        for i in range(3):
            data = bytes([65 + turn]) * (MiB - 100) + f"{turn}.{i}".encode()
            cid = raw_cid(data)
            pds.blobs[cid] = seal_blob(data, key_id=kid, keyring=keyring)
            ref = BlobRef.of(cid, "text/plain", len(data))
            parts.append(FilePart(file=ref, name=f"{turn}-{i}.txt", extracted=ExtractedText(text=ref, method="text")))
        got = await _blobs_for(deps, [opened(f"m{turn}", user(None), *parts)], {f"m{turn}": kid})  # type: ignore[arg-type]
        assert len(got) == 3
        assert sum(map(len, deps.blob_cache.values())) <= 8 * MiB
    assert pds.fetches == 18
    assert len(deps.blob_cache) == 8  # the newest eight of the eighteen


def test_keep_blob_drops_the_oldest_first_and_keeps_the_newest_even_alone() -> None:
    cache: OrderedDict[str, bytes] = OrderedDict()
    for i in range(100):
        keep_blob(cache, f"c{i}", b"x", 1000)
    assert list(cache) == [f"c{i}" for i in range(36, 100)]  # at most 64
    keep_blob(cache, "big", b"y" * 2000, 1000)
    assert list(cache) == ["big"]
