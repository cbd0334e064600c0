"""The typed seams between the turn engine and the imperative shell: what the worker's
turn needs of the PDS and of the model client. The real ones are ``pds.PdsClient`` and
``adapters.client.ModelClient``; ``worker.offline`` implements both for a record file
(``OfflineRepo``, ``CaptureModel``), and the tests' fakes implement them too. The state
store (``state.StateStore``) and the tool registry (``tools.ToolRegistry``) are single
classes, typed as such.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gelbridge._adapters.client import ModelResult
    from gelbridge._pds import PutResult
    from gelbridge.lux import LuxRequest
    from gelbridge.lux._stream import StreamEvent


class Repo(Protocol):
    """One account's repo on its PDS, as a turn reads and writes it."""

    pds_url: str

    @property
    def session(self) -> Any: ...

    async def get_record(self, collection: str, rkey: str, *,
                         repo: str | None = None) -> tuple[str | None, dict[str, Any]] | None: ...

    async def sync_get_record(self, collection: str, rkey: str, *, repo: str | None = None) -> bytes | None: ...

    async def put_record(self, collection: str, rkey: str, record: Mapping[str, Any], *,
                         swap_record: Any = ..., validate: bool | None = None,
                         must_land: bool = False) -> PutResult: ...

    def iter_records(self, collection: str, *, page_size: int = 100, reverse: bool = False) -> AsyncIterator[Any]: ...

    async def get_blob(self, did: str, cid: str) -> bytes: ...

    async def upload_blob(self, data: bytes, mime: str = "application/octet-stream") -> dict[str, Any]: ...


class Printer(Protocol):
    """Where start-up lines go (a text stream: ``sys.stdout``, ``io.StringIO``, ...)."""

    def write(self, s: str, /) -> int: ...

    def flush(self) -> None: ...


class ModelCaller(Protocol):
    """Sends a Lux IR request to a configured provider and returns its response."""

    async def complete(self, request: LuxRequest, *, provider: str, stream: bool | None = None,
                       on_event: Callable[[StreamEvent], None] | None = None) -> ModelResult: ...

    async def aclose(self) -> None: ...
