"""PdsClient against the real local reference PDS (no mocks)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import httpx
import pytest

from gelbridge._dev.pds import AccountInfo, DevPds, free_port
from gelbridge._errors import ClaimConflict, PdsAuthError, PdsError, PdsUnavailable
from gelbridge._pds import PdsClient, Session, jwt_expiry

pytestmark = [pytest.mark.pds, pytest.mark.timeout(120)]

MSG = "chat.gel.assistant.message"
REPLY_KEY = "3mabcdefghij2.r0"


def message(text_bytes: bytes, status: str = "pending") -> dict:
    return {
        "$type": MSG,
        "conversation": "3mabcdefghaa2",
        "role": "assistant",
        "parent": "3mabcdefghij2",
        "status": status,
        "content": {
            "$type": "chat.gel.assistant.defs#encryptedContent",
            "scheme": "xchacha20poly1305-v1",
            "keyId": "k1",
            "nonce": {"$bytes": base64.b64encode(b"\x01" * 24).decode()},
            "ciphertext": {"$bytes": base64.b64encode(text_bytes).decode()},
        },
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def expired_copy(token: str) -> str:
    """The same access token with exp in the past, re-signed with the dev PDS's JWT
    secret (dev-env's fixed 'jwt-secret'), so the PDS answers ExpiredToken."""
    header_b64, payload_b64, _ = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(payload_b64 + "=" * (-len(payload_b64) % 4)))
    now = int(time.time())
    payload.update(iat=now - 7200, exp=now - 60)
    signing_input = f"{header_b64}.{_b64url(json.dumps(payload).encode())}"
    sig = hmac.new(b"jwt-secret", signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(sig)}"


async def test_login_reports_session_and_resume_needs_no_new_login(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    seen: list[Session] = []
    async with PdsClient(dev_pds.pds_url, on_session_change=seen.append) as c:
        s = await c.login(pds_account.handle, pds_account.app_password)
    assert seen == [s]
    assert s.did == pds_account.did and s.handle == pds_account.handle
    assert s.access_jwt not in repr(s) and s.refresh_jwt not in repr(s)

    stored = Session.from_dict(json.loads(json.dumps(s.to_dict())))
    seen2: list[Session] = []
    async with PdsClient(dev_pds.pds_url, on_session_change=seen2.append) as c2:
        c2.resume(stored)
        put = await c2.put_record(MSG, "3mresume00002", message(b"x"))
        assert put.committed
    assert seen2 == []  # token still fresh: no refresh, no login


async def test_refresh_rotates_tokens_and_reports_new_session(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    seen: list[Session] = []
    async with PdsClient(dev_pds.pds_url, on_session_change=seen.append) as c:
        first = await c.login(pds_account.handle, pds_account.app_password)
        second = await c.refresh()
        assert second.refresh_jwt != first.refresh_jwt
        assert seen == [first, second]
        assert await c.get_record(MSG, "nothing-here") is None  # new token works


async def test_near_expiry_token_is_refreshed_before_the_call(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    seen: list[Session] = []
    async with PdsClient(dev_pds.pds_url) as login_client:
        s = await login_client.login(pds_account.handle, pds_account.app_password)
    exp = jwt_expiry(s.access_jwt)
    assert exp is not None and exp > time.time()
    margin = exp - time.time() + 60  # every token counts as "about to expire"
    async with PdsClient(
        dev_pds.pds_url, session=s, on_session_change=seen.append, refresh_margin=margin
    ) as c:
        await c.put_record(MSG, "3mrefresh0002", message(b"y"))
    assert len(seen) == 1 and seen[0].refresh_jwt != s.refresh_jwt


async def test_expired_token_answer_triggers_refresh_and_retry(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    async with PdsClient(dev_pds.pds_url) as login_client:
        s = await login_client.login(pds_account.handle, pds_account.app_password)
    stale = Session(s.did, s.handle, expired_copy(s.access_jwt), s.refresh_jwt)
    async with httpx.AsyncClient() as http:  # the forged token really is "expired" to the PDS
        r = await http.get(
            f"{dev_pds.pds_url}/xrpc/com.atproto.server.getSession",
            headers={"Authorization": f"Bearer {stale.access_jwt}"},
        )
    assert r.status_code == 400 and r.json()["error"] == "ExpiredToken"
    seen: list[Session] = []
    # a negative margin turns off the proactive refresh: the PDS must say ExpiredToken
    async with PdsClient(
        dev_pds.pds_url, session=stale, on_session_change=seen.append, refresh_margin=-1e9
    ) as c:
        put = await c.put_record(MSG, "3mexpired0002", message(b"z"))
        assert put.committed
    assert len(seen) == 1 and seen[0].access_jwt != stale.access_jwt


async def test_wrong_password_is_an_auth_error(dev_pds: DevPds, pds_account: AccountInfo) -> None:
    async with PdsClient(dev_pds.pds_url) as c:
        with pytest.raises(PdsAuthError):
            await c.login(pds_account.handle, "not-the-password")


async def test_a_session_says_whether_the_main_password_made_it_and_logout_ends_it(
    dev_pds: DevPds, pds_account: AccountInfo
) -> None:
    async with PdsClient(dev_pds.pds_url) as c:
        main = await c.login(pds_account.handle, pds_account.password)
        app = await c.login(pds_account.handle, pds_account.app_password)
        assert main.main_password and not app.main_password
        await c.logout()
        assert c.session is None
    async with PdsClient(dev_pds.pds_url, session=app) as gone:
        with pytest.raises(PdsAuthError):  # the PDS forgot the session: its refresh token is refused
            await gone.refresh()


async def test_put_get_list_with_non_tid_key_and_bytes(client: PdsClient) -> None:
    ct = bytes(range(256))
    put = await client.put_record(MSG, REPLY_KEY, message(ct))
    assert put.committed and put.uri == f"at://{client.did}/{MSG}/{REPLY_KEY}"
    got = await client.get_record(MSG, REPLY_KEY)
    assert got is not None
    cid, value = got
    assert cid == put.cid
    assert base64.b64decode(value["content"]["ciphertext"]["$bytes"] + "==") == ct
    assert value["parent"] == "3mabcdefghij2"

    await client.put_record(MSG, "3mabcdefghij2", message(b"user"))
    page = await client.list_records(MSG, limit=10, reverse=True)
    assert [r.rkey for r in page.records] == ["3mabcdefghij2", REPLY_KEY]
    page_desc = await client.list_records(MSG, limit=10)
    assert [r.rkey for r in page_desc.records] == [REPLY_KEY, "3mabcdefghij2"]
    assert await client.get_record(MSG, "3mabcdefghij2.r9") is None


async def test_iter_records_walks_every_page(client: PdsClient) -> None:
    keys = [f"3mpage{i:07d}" for i in range(7)]
    for k in keys:
        await client.put_record(MSG, k, message(k.encode()))
    got = [r.rkey async for r in client.iter_records(MSG, page_size=3, reverse=True)]
    assert got == keys
    bounded = [r.rkey async for r in client.iter_records(MSG, page_size=3, max_pages=2, reverse=True)]
    assert bounded == keys[:6]


async def test_create_only_claim_semantics(client: PdsClient) -> None:
    rec = message(b"claim")
    assert await client.create_only(MSG, REPLY_KEY, rec) is True
    assert await client.create_only(MSG, REPLY_KEY, rec) is False  # identical: no commit
    with pytest.raises(ClaimConflict):
        await client.create_only(MSG, REPLY_KEY, message(b"claim", status="streaming"))
    cid, value = await client.get_record(MSG, REPLY_KEY) or ("", {})
    assert value["status"] == "pending"


async def test_swap_record_updates_only_if_unchanged(client: PdsClient) -> None:
    first = await client.put_record(MSG, REPLY_KEY, message(b"a"))
    second = await client.put_record(MSG, REPLY_KEY, message(b"a", "streaming"), swap_record=first.cid)
    with pytest.raises(ClaimConflict):
        await client.put_record(MSG, REPLY_KEY, message(b"a", "complete"), swap_record=first.cid)
    got = await client.get_record(MSG, REPLY_KEY)
    assert got is not None and got[0] == second.cid


async def test_delete_record(client: PdsClient) -> None:
    await client.put_record(MSG, REPLY_KEY, message(b"d"))
    await client.delete_record(MSG, REPLY_KEY)
    assert await client.get_record(MSG, REPLY_KEY) is None


async def test_blob_round_trip_and_size_limit(client: PdsClient) -> None:
    data = bytes(range(256)) * 64 + b"\x00tail"
    ref = await client.upload_blob(data)
    assert ref["$type"] == "blob" and ref["size"] == len(data)
    cid = ref["ref"]["$link"]
    rec = message(b"with blob")
    rec["content"]["blobs"] = [ref]
    await client.put_record(MSG, REPLY_KEY, rec)  # referenced, so the PDS keeps it
    assert await client.get_blob(client.did, cid) == data
    with pytest.raises(PdsError, match="limit"):
        await client.get_blob(client.did, cid, max_bytes=100)


async def test_get_repo_returns_a_car_with_the_record(client: PdsClient) -> None:
    from atproto_core.car import CAR

    await client.put_record(MSG, REPLY_KEY, message(b"car"))
    car = CAR.from_bytes(await client.get_repo(client.did))
    assert any(isinstance(b, dict) and b.get("$type") == MSG for b in car.blocks.values())


async def test_unreachable_pds_is_pds_unavailable_after_bounded_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with PdsClient(url, max_retries=2, backoff_base=0.01) as c:
        started = time.monotonic()
        with pytest.raises(PdsUnavailable, match="cannot reach"):
            await c.list_records(MSG, repo="did:plc:nobody")
        assert time.monotonic() - started < 10


async def test_calls_without_session_say_to_log_in(dev_pds: DevPds) -> None:
    async with PdsClient(dev_pds.pds_url) as c:
        with pytest.raises(PdsAuthError, match="log in|login"):
            await c.put_record(MSG, REPLY_KEY, message(b"x"))
