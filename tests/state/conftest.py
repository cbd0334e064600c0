"""Both state backends, for the one store suite: ``async with open_store() as s`` opens a
store at the test's own location (a SQLite file, or a fresh Postgres database); opening
it again opens the same state again, as a restarted or second worker would
(``await open_store().open()`` outside ``async with``)."""

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


class _Sqlite(SqliteStore):
    async def open(self) -> _Sqlite:  # the same call as PostgresStore's (a file opens at once)
        return self


def open_at(where: str, **kw: Any) -> StateStore:
    """A store at ``where``: a Postgres one connects in ``open()`` or ``async with``."""
    if where.startswith("postgresql://"):
        return PostgresStore(where, **kw)
    return _Sqlite(where, **kw)


@pytest.fixture
def open_store(where: str) -> OpenStore:
    return lambda **kw: open_at(where, **kw)
