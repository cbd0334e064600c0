"""Both state backends, for the one store suite: ``open_store()`` opens a store at the
test's own location (a SQLite file, or a fresh Postgres database); calling it again
opens the same state again, as a restarted or second worker would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gelbridge._state import DB_FILENAME, SqliteStore, StateStore
from gelbridge._state._postgres import PostgresStore

OpenStore = Callable[..., StateStore]


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's state location: a SQLite file path, or a fresh Postgres database URL."""
    if request.param == "sqlite":
        return str(tmp_path / "state" / DB_FILENAME)
    url: str = request.getfixturevalue("postgres_url")
    return url


def open_at(where: str, **kw: Any) -> StateStore:
    if where.startswith("postgresql://"):
        return PostgresStore(where, **kw)
    return SqliteStore(where, **kw)


@pytest.fixture
def open_store(where: str) -> OpenStore:
    return lambda **kw: open_at(where, **kw)
