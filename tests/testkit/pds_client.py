"""The ``client`` fixture of the PDS and firehose tests: a logged-in ``PdsClient`` (the
PDS itself comes from tests/conftest.py). Their conftests import it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._pds import PdsClient


@pytest.fixture
async def client(dev_pds: DevPds, pds_account: AccountInfo) -> AsyncIterator[PdsClient]:
    """A PdsClient logged in to a fresh account with its app password."""
    async with PdsClient(dev_pds.pds_url) as c:
        await c.login(pds_account.handle, pds_account.app_password)
        yield c
