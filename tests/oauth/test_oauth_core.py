"""The pure OAuth core: RFC vectors for PKCE (7636) and the JWK thumbprint (9449's
example key), ES256 JWS checked by an independent verifier (pyca's ECDSA over the DER
form), DPoP proof claims, nonce bookkeeping and the scope check."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gelbridge._errors import OAuthError
from gelbridge._oauth.dpop import NonceBook, access_token_hash, dpop_proof, htu_of, is_nonce_error
from gelbridge._oauth.jose import EcKey, b64url_decode, jwk_thumbprint, pkce_challenge, pkce_pair, verify_es256
from gelbridge._oauth.scopes import BRIDGE_SCOPE, BRIDGE_SCOPES, check_granted


def test_pkce_rfc7636_appendix_b() -> None:
    assert pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk") == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    v, c = pkce_pair()
    assert len(v) == 43 and pkce_challenge(v) == c and pkce_pair()[0] != v


def test_thumbprint_of_the_rfc9449_example_key() -> None:
    jwk = {"kty": "EC", "x": "l8tFrhx-34tV3hRICRDY9zCkDlpBhF42UQUfWVAWBFs",
           "y": "9VE4jf_Ok_o64zbTTlcuNJajHmt6v9TDVrU0CdvGRDA", "crv": "P-256"}
    assert jwk_thumbprint(jwk) == "0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I"


def independent_verify(token: str, key: EcKey) -> dict[str, object]:
    """Verify without gelbridge's verifier: split, rebuild DER from r || s, pyca ECDSA."""
    h, c, s = token.split(".")
    sig = b64url_decode(s)
    assert len(sig) == 64
    der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    key.private.public_key().verify(der, f"{h}.{c}".encode(), ec.ECDSA(hashes.SHA256()))
    return json.loads(b64url_decode(c))


def test_es256_jws_round_trip_and_tampering() -> None:
    key = EcKey.generate("k1")
    token = key.sign({"typ": "JWT", "kid": "k1", "alg": "none"}, {"iss": "me", "n": 1})
    assert independent_verify(token, key) == {"iss": "me", "n": 1}
    header, claims = verify_es256(token, key.public_jwk())
    assert header == {"typ": "JWT", "kid": "k1", "alg": "ES256"} and claims["iss"] == "me"
    h, c, s = token.split(".")
    forged = c[:-2] + ("AA" if c[-2:] != "AA" else "BB")
    for bad in (f"{h}.{forged}.{s}", f"{h}.{c}.{s[:-4]}", token + ".x", "junk"):
        with pytest.raises(OAuthError):
            verify_es256(bad, key.public_jwk())
    with pytest.raises(OAuthError):
        verify_es256(token, EcKey.generate().public_jwk())  # another key


def test_jwk_round_trip_keeps_the_key_and_refuses_a_mismatched_half() -> None:
    key = EcKey.generate("k2")
    again = EcKey.from_jwk(key.private_jwk())
    assert again.thumbprint() == key.thumbprint() and again.kid == "k2"
    assert "d" not in key.public_jwk() and key.private_jwk()["d"] not in repr(key)
    other = EcKey.generate().public_jwk()
    with pytest.raises(OAuthError, match="does not belong"):
        EcKey.from_jwk({**key.private_jwk(), "x": other["x"], "y": other["y"]})
    for bad in ({}, {"kty": "RSA"}, {"kty": "EC", "crv": "P-256", "d": "=="}):
        with pytest.raises(OAuthError):
            EcKey.from_jwk(bad)


def test_dpop_proof_claims() -> None:
    key = EcKey.generate()
    proof = dpop_proof(key, "post", "http://LOCALHOST:2583/xrpc/com.atproto.repo.putRecord?x=1#f",
                       nonce="n-1", access_token="tok", now=1000.0, jti="j1")
    header = json.loads(b64url_decode(proof.split(".")[0]))
    assert header["typ"] == "dpop+jwt" and header["alg"] == "ES256" and header["jwk"] == key.public_jwk()
    assert "d" not in header["jwk"]
    assert independent_verify(proof, key) == {
        "jti": "j1", "htm": "POST", "htu": "http://localhost:2583/xrpc/com.atproto.repo.putRecord",
        "iat": 1000, "nonce": "n-1", "ath": access_token_hash("tok")}
    # an authorization-server proof: no ath, no nonce until the server gave one; jti fresh each time
    a = independent_verify(dpop_proof(key, "POST", "http://localhost:2583/oauth/par"), key)
    b = independent_verify(dpop_proof(key, "POST", "http://localhost:2583/oauth/par"), key)
    assert "ath" not in a and "nonce" not in a and a["jti"] != b["jti"]
    assert htu_of("https://pds.example/") == "https://pds.example/" and htu_of("https://pds.example") == "https://pds.example/"


def test_nonce_errors_from_either_server() -> None:
    assert is_nonce_error(400, {}, b'{"error":"use_dpop_nonce","error_description":"Authorization server requires nonce"}')
    assert is_nonce_error(401, {"www-authenticate": 'DPoP algs="ES256", error="use_dpop_nonce"'}, b"")
    assert not is_nonce_error(401, {"www-authenticate": 'DPoP error="invalid_token"'}, b'{"error":"invalid_token"}')
    assert not is_nonce_error(400, {}, b'{"error":"invalid_grant"}')
    assert not is_nonce_error(500, {}, b'{"error":"use_dpop_nonce"}') and not is_nonce_error(400, {}, b"<html>")


def test_nonce_book_is_per_server_and_bounded() -> None:
    book = NonceBook()
    assert book.get("http://localhost:1/oauth/token") is None
    assert book.seen("http://localhost:1/oauth/par", {"DPoP-Nonce": "a"})
    assert not book.seen("http://localhost:1/oauth/token", {"DPoP-Nonce": "a"})  # same server, not new
    assert book.get("http://localhost:1/xrpc/x") == "a" and book.get("http://localhost:2/") is None
    assert book.seen("http://localhost:1/", {"dpop-nonce": "b"}) and book.get("http://localhost:1/") == "b"
    assert not book.seen("http://localhost:1/", {}) and not book.seen("http://localhost:1/", {"DPoP-Nonce": "x" * 600})
    for i in range(200):
        book.seen(f"http://h{i}.example/", {"DPoP-Nonce": "n"})
    assert len(book._nonces) == NonceBook.MAX_SERVERS


def test_the_bridge_scope_names_each_collection_and_no_wildcard() -> None:
    assert BRIDGE_SCOPES[0] == "atproto" and BRIDGE_SCOPE.split() == list(BRIDGE_SCOPES)
    assert not any("*" in s for s in BRIDGE_SCOPES)
    assert "repo:chat.gel.assistant.message?action=create&action=update" in BRIDGE_SCOPES
    assert "blob:application/octet-stream" in BRIDGE_SCOPES


def test_check_granted() -> None:
    assert check_granted(BRIDGE_SCOPE, BRIDGE_SCOPE) == frozenset()
    assert check_granted(BRIDGE_SCOPE, BRIDGE_SCOPE + " repo:*") == {"repo:*"}  # broader: reported
    # what the PDS does to a partial wildcard: drops it silently; the check catches the loss
    dropped = "atproto repo:chat.gel.assistant.bridge blob:application/octet-stream"
    with pytest.raises(OAuthError, match=r"without repo:chat\.gel\.assistant\.message\?action=create"):
        check_granted(BRIDGE_SCOPE, dropped)
    with pytest.raises(OAuthError, match="without atproto"):
        check_granted("repo:x.y.z", "repo:x.y.z")
    for none in (None, "", 5):
        with pytest.raises(OAuthError, match="names no scope"):
            check_granted(BRIDGE_SCOPE, none)


def test_authorization_server_metadata_is_checked() -> None:
    from gelbridge._oauth.server import AuthServer, check_server_url

    iss = "https://auth.example"
    meta = {"issuer": iss, "pushed_authorization_request_endpoint": f"{iss}/par",
            "authorization_endpoint": f"{iss}/authorize", "token_endpoint": f"{iss}/token",
            "revocation_endpoint": f"{iss}/revoke", "code_challenge_methods_supported": ["S256"],
            "dpop_signing_alg_values_supported": ["ES256"]}
    server = AuthServer.from_metadata(meta, issuer=iss, allow_loopback_http=False)
    assert server.token_endpoint == f"{iss}/token" and server.revocation_endpoint == f"{iss}/revoke"
    for bad, why in (({**meta, "issuer": "https://evil.example"}, "names issuer"),
                     ({**meta, "code_challenge_methods_supported": ["plain"]}, "S256"),
                     ({**meta, "dpop_signing_alg_values_supported": ["RS256"]}, "ES256"),
                     ({**meta, "token_endpoint": "http://auth.example/token"}, "not an https URL"),
                     ({k: v for k, v in meta.items() if k != "token_endpoint"}, "no token_endpoint")):
        with pytest.raises(OAuthError, match=why):
            AuthServer.from_metadata(bad, issuer=iss, allow_loopback_http=False)
    assert check_server_url("http://localhost:2583/", allow_loopback_http=True) == "http://localhost:2583"
    for url in ("http://localhost:2583", "http://pds.example", "ftp://x.example", "https://"):
        with pytest.raises(OAuthError):
            check_server_url(url, allow_loopback_http=url != "http://localhost:2583")
