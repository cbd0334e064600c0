"""In-memory stand-ins shared by the worker unit tests (imported as a top-level module,
like tests/mapping/mapping_builders.py: tests/ has no __init__.py)."""

from __future__ import annotations

from typing import Any

from gelbridge._errors import ClaimConflict
from gelbridge._pds import PutResult

DID = "did:plc:abcdefghijklmnopqrstuvwx"


class FakePds:
    """putRecord with swap checks, in memory."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, dict[str, Any], Any]] = []
        self.records: dict[str, tuple[str, dict[str, Any]]] = {}

    async def put_record(self, collection: str, rkey: str, value: dict[str, Any], *, swap_record: Any,
                         must_land: bool = False) -> PutResult:
        cur = self.records.get(rkey)
        if (swap_record is None and cur is not None) or (swap_record is not None and (cur is None or cur[0] != swap_record)):
            raise ClaimConflict("swap mismatch")
        cid = f"cid{len(self.puts)}"
        self.puts.append((rkey, value, swap_record))
        self.records[rkey] = (cid, value)
        return PutResult(uri=f"at://{DID}/{collection}/{rkey}", cid=cid, committed=True)

    async def get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> Any:
        return self.records.get(rkey)


class Clock:
    """A clock the test moves by hand (set ``t``)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
