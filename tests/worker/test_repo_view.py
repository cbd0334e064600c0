"""RepoView's sync.getRecord fallback reports an unreachable PDS as a PdsError."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gelbridge._errors import PdsUnavailable
from gelbridge._pds import PdsClient
from gelbridge._worker.repo import RepoView


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class FailingPds(PdsClient):
    """A real client whose repo.getRecord answers 500, so the sync.getRecord fallback runs."""

    async def get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> Any:
        raise PdsUnavailable("getRecord failed (HTTP 500)", status=500)


@pytest.mark.timeout(30)
async def test_fallback_to_an_unreachable_pds_raises_pds_unavailable_not_an_httpx_error() -> None:
    async with FailingPds(f"http://127.0.0.1:{closed_port()}", max_retries=0) as pds:
        view = RepoView(pds, "did:plc:test")
        with pytest.raises(PdsUnavailable):
            await view.get("3mabcdefghij2", fresh=True)
