"""A chat app written only from docs/protocol.md, sharing nothing with gelbridge's code:
XRPC with httpx, sealing with PyNaCl, the key grant with pyca ``cryptography``'s HPKE.

    python independent_app.py PDS_URL HANDLE FINGERPRINT TEXT [--revoke]

The app password is ``$APP_PASSWORD``. It finds the bridge record, refuses it unless its
fingerprint is the one given (the pin), makes a fresh conversation key, grants it,
sends ``TEXT`` and waits for the reply; with ``--revoke`` it then deletes the grant and
sends a second message with the same key. Prints one JSON line: what it saw.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt, crypto_aead_xchacha20poly1305_ietf_encrypt

NS = "chat.gel.assistant"
SEAL = "xchacha20poly1305-v1"
GRANT = "hpke-x25519-v1"
B32 = "234567abcdefghijklmnopqrstuvwxyz"
_last = [0]


def tid() -> str:
    micros = max(time.time_ns() // 1000, _last[0] + 1)
    _last[0] = micros
    n = (micros << 10) | 7
    return "".join(B32[(n >> (5 * i)) & 31] for i in reversed(range(13)))


def b(data: bytes) -> dict[str, str]:
    return {"$bytes": base64.b64encode(data).decode().rstrip("=")}


def unb(v: dict[str, str]) -> bytes:
    s = v["$bytes"]
    return base64.b64decode(s + "=" * (-len(s) % 4))


def fingerprint(pub: bytes) -> str:
    h = hashlib.sha256(pub).hexdigest()[:24]
    return "-".join(h[i:i + 4] for i in range(0, 24, 4))


class App:
    def __init__(self, pds: str, handle: str, password: str) -> None:
        self.http = httpx.Client(base_url=pds.rstrip("/") + "/xrpc/", timeout=10)
        s = self.http.post("com.atproto.server.createSession", json={"identifier": handle, "password": password})
        s.raise_for_status()
        self.did = s.json()["did"]
        self.http.headers["authorization"] = "Bearer " + s.json()["accessJwt"]

    def call(self, method: str, **body: Any) -> Any:
        r = self.http.post(method, json={"repo": self.did, **body})
        r.raise_for_status()
        return r.json()

    def get(self, collection: str, rkey: str) -> Any:
        r = self.http.get("com.atproto.repo.getRecord", params={"repo": self.did, "collection": collection,
                                                                "rkey": rkey})
        return r.json()["value"] if r.status_code == 200 else None

    def bridges(self) -> list[tuple[str, dict[str, Any]]]:
        r = self.http.get("com.atproto.repo.listRecords", params={"repo": self.did, "collection": f"{NS}.bridge"})
        r.raise_for_status()
        return [(x["uri"].rsplit("/", 1)[1], x["value"]) for x in r.json()["records"]]

    def grant(self, kid: str, pub: bytes, key_id: str, key: bytes) -> str:
        rkey = tid()
        uri = f"at://{self.did}/{NS}.keyGrant/{rkey}"
        info = "\n".join([GRANT, uri, key_id, kid]).encode()
        sealed = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.CHACHA20_POLY1305).encrypt(
            key, X25519PublicKey.from_public_bytes(pub), info)
        self.call("com.atproto.repo.putRecord", collection=f"{NS}.keyGrant", rkey=rkey, record={
            "$type": f"{NS}.keyGrant", "scheme": GRANT, "recipient": kid, "keyId": key_id,
            "sealedKey": b(sealed), "createdAt": now()})
        return rkey

    def send(self, conversation: str, text: str, key_id: str, key: bytes, parent: str | None) -> str:
        rkey = tid()
        uri = f"at://{self.did}/{NS}.message/{rkey}"
        plain = {"$type": f"{NS}.defs#plainContent", "parts": [{"$type": f"{NS}.defs#textPart", "text": text}]}
        nonce = os.urandom(24)
        ct = crypto_aead_xchacha20poly1305_ietf_encrypt(json.dumps(plain).encode(), f"{SEAL}\n{uri}\n{key_id}".encode(),
                                                        nonce, key)
        record: dict[str, Any] = {
            "$type": f"{NS}.message", "conversation": conversation, "role": "user", "createdAt": now(),
            "generation": {"attempt": 0},
            "content": {"$type": f"{NS}.defs#encryptedContent", "scheme": SEAL, "keyId": key_id, "nonce": b(nonce),
                        "ciphertext": b(ct)}}
        if parent:
            record["parent"] = parent
        self.call("com.atproto.repo.putRecord", collection=f"{NS}.message", rkey=rkey, record=record)
        return rkey

    def wait_reply(self, rkey: str, key: bytes, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.get(f"{NS}.message", rkey + ".r0")
            if v is not None and v.get("status") in ("complete", "error", "cancelled", "awaitingApproval"):
                out: dict[str, Any] = {"status": v["status"], "error": (v.get("error") or {}).get("kind")}
                c = v["content"]
                uri = f"at://{self.did}/{NS}.message/{rkey}.r0"
                if c.get("scheme") == SEAL:
                    pt = crypto_aead_xchacha20poly1305_ietf_decrypt(
                        unb(c["ciphertext"]), f"{SEAL}\n{uri}\n{c['keyId']}".encode(), unb(c["nonce"]), key)
                    parts = json.loads(pt)["parts"]
                    out["text"] = "".join(p.get("text", "") for p in parts if p["$type"].endswith("#textPart"))
                    out["keyId"] = c["keyId"]
                return out
            time.sleep(0.2)
        return {"status": "timeout"}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def main() -> int:
    pds, handle, pin, text = sys.argv[1:5]
    app = App(pds, handle, os.environ["APP_PASSWORD"])
    found = app.bridges()
    if len(found) != 1:
        print(json.dumps({"refused": f"{len(found)} bridge records"}))
        return 3
    kid, rec = found[0]
    pub = unb(rec["publicKey"])
    if rec.get("scheme") != GRANT or len(pub) != 32 or fingerprint(pub) != pin:
        print(json.dumps({"refused": "fingerprint", "seen": fingerprint(pub)}))
        return 3
    key, key_id = os.urandom(32), "app-" + os.urandom(6).hex()
    grant = app.grant(kid, pub, key_id, key)
    conversation = tid()
    first = app.send(conversation, text, key_id, key, None)
    result: dict[str, Any] = {"grant": grant, "first": app.wait_reply(first, key)}
    if "--revoke" in sys.argv:
        app.call("com.atproto.repo.deleteRecord", collection=f"{NS}.keyGrant", rkey=grant)
        time.sleep(1.0)  # the delete reaches the bridge on its event source
        second = app.send(conversation, text + " again", key_id, key, first + ".r0")
        result["second"] = app.wait_reply(second, key)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
