"""Session-wide fixtures shared by every test area (keep this file small)."""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Iterator

import pytest

from gelbridge._dev.pds import AccountInfo, DevPds, create_account
from gelbridge._dev.postgres import DevPostgres

_account_counter = itertools.count()
_database_counter = itertools.count()


@pytest.fixture(scope="session")
def dev_pds() -> Iterator[DevPds]:
    """One real reference PDS (+ PLC) on loopback for the whole session.

    Fails loudly (never skips) when it cannot start: run `bash scripts/pds/install.sh`.
    Node's stderr goes to $GELBRIDGE_PDS_LOG if set.
    """
    pds = DevPds(log_file=os.environ.get("GELBRIDGE_PDS_LOG"))
    try:
        pds.start(timeout=180)
    except Exception as e:  # turn into a test error with the reason, not a skip
        pytest.fail(f"the local reference PDS did not start: {e}", pytrace=False)
    try:
        yield pds
    finally:
        pds.stop()


@pytest.fixture
def pds_account(dev_pds: DevPds) -> AccountInfo:
    """A fresh account (unique `.test` handle) with an app password on the dev PDS."""
    handle = f"u{next(_account_counter)}x{secrets.token_hex(4)}.test"  # front part <= 18 chars
    return create_account(dev_pds.pds_url, handle, secrets.token_urlsafe(12))


@pytest.fixture(scope="session")
def dev_postgres() -> Iterator[DevPostgres]:
    """One real PostgreSQL cluster on loopback for the whole session (scripts/postgres).

    Fails loudly (never skips) when it cannot start: run `bash scripts/postgres/install.sh`.
    """
    pg = DevPostgres()
    try:
        pg.start(timeout=120)
    except Exception as e:  # a test error with the reason, not a skip
        pytest.fail(f"the local PostgreSQL did not start: {e}", pytrace=False)
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def postgres_url(dev_postgres: DevPostgres) -> str:
    """The URL of a fresh, empty database on the session's cluster."""
    return dev_postgres.create_database(f"t{os.getpid()}_{next(_database_counter)}")
