"""Helpers for worker tests against the real local PDS: the app side (sealed user
messages), a local model server, settings, an in-process worker, bounded waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._errors import PdsUnavailable
from gelbridge._pds import PdsClient
from gelbridge._records import (
    MESSAGE_COLLECTION,
    AtUri,
    MessageRecord,
    PlainContent,
    TextPart,
    new_tid,
    now_datetime,
)
from gelbridge._records.codec import to_json_form
from gelbridge._records.models import Part
from gelbridge._runtime import Runtime
from gelbridge._sealing import Keyring, content_of, seal_content
from gelbridge._worker import Worker

if TYPE_CHECKING:
    from .worker_proc import WorkerProc

PASSWORD_ENV = "GELBRIDGE_TEST_APP_PASSWORD"


@dataclass
class App:
    """The chat app's side: writes sealed user messages, reads and opens replies."""

    pds: PdsClient
    keyring: Keyring
    key_id: str

    @property
    def did(self) -> str:
        return self.pds.did

    def uri(self, rkey: str) -> AtUri:
        return AtUri(self.did, MESSAGE_COLLECTION, rkey)

    async def send(
        self,
        text: str | None,
        *,
        conversation: str,
        parent: str | None = None,
        attempt: int = 0,
        rkey: str | None = None,
        parts: list[Part] | None = None,
        generation: dict[str, Any] | None = None,
        key_id: str | None = None,
    ) -> str:
        rkey = rkey or new_tid()
        kid = key_id or self.key_id
        body = parts if parts is not None else [TextPart(text=text or "")]
        content = seal_content(PlainContent(parts=body), uri=self.uri(rkey), key_id=kid, keyring=self.keyring)
        value: dict[str, Any] = {
            "$type": MESSAGE_COLLECTION,
            "conversation": conversation,
            "role": "user",
            "content": content.to_value(),
            "generation": generation if generation is not None else {"attempt": attempt},
            "createdAt": now_datetime(),
        }
        if parent is not None:
            value["parent"] = parent
        await self.pds.put_record(MESSAGE_COLLECTION, rkey, value)
        return rkey

    async def regenerate(self, rkey: str, attempt: int) -> None:
        got = await self.get(rkey)
        assert got is not None
        value = to_json_form(got[1])
        value["generation"] = {**(value.get("generation") or {}), "attempt": attempt}
        await self.pds.put_record(MESSAGE_COLLECTION, rkey, value)

    async def get(self, rkey: str) -> tuple[str, dict[str, Any]] | None:
        """getRecord; via sync.getRecord (CAR) when the dev PDS cannot serve a record
        holding blob refs as JSON (it answers 500)."""
        try:
            return await self.pds.get_record(MESSAGE_COLLECTION, rkey)
        except PdsUnavailable:
            from gelbridge._worker.repo import RepoView

            return await RepoView(self.pds, self.did)._sync_get(rkey)

    async def reply(self, rkey: str) -> tuple[MessageRecord, PlainContent | None] | None:
        got = await self.get(rkey)
        if got is None:
            return None
        rec = MessageRecord.from_value(got[1])
        try:
            content = content_of(rec.content, uri=self.uri(rkey), keyring=self.keyring)
        except Exception:  # noqa: BLE001
            content = None
        return rec, content

    async def wait_status(
        self, rkey: str, statuses: set[str] | str, timeout: float = 30.0, interval: float = 0.1
    ) -> tuple[MessageRecord, PlainContent | None]:
        want = {statuses} if isinstance(statuses, str) else statuses
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            got = await self.reply(rkey)
            if got is not None:
                last = got[0].status
                if got[0].status in want:
                    return got
            await asyncio.sleep(interval)
        raise AssertionError(f"reply {rkey} did not reach {want} within {timeout} s (last status {last})")

    async def replies_of(self, message_rkey: str) -> list[str]:
        out = []
        async for r in self.pds.iter_records(MESSAGE_COLLECTION):
            if r.rkey.startswith(message_rkey + ".r"):
                out.append(r.rkey)
        return sorted(out)


def text_of(content: PlainContent | None) -> str:
    assert content is not None
    return "".join(p.text for p in content.parts if isinstance(p, TextPart))


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as srv:
        yield srv


@pytest.fixture
def procs() -> Iterator[list[WorkerProc]]:
    """Worker subprocesses a test started (worker_proc.start_worker); killed at the end."""
    made: list[WorkerProc] = []
    yield made
    for p in made:
        p.stop()


@pytest.fixture
def keyring() -> tuple[Keyring, str]:
    kr = Keyring()
    kid = kr.add_new("k-test")
    return kr, kid


def make_settings(
    pds_url: str, account: AccountInfo, state_dir: Path, model_url: str, **over: Any
) -> Settings:
    data: dict[str, Any] = {
        "account": {"pds": pds_url, "identifier": account.handle, "password_env": PASSWORD_ENV},
        "state": {"dir": str(state_dir)},
        "defaults": {"model": {"provider": "local", "id": "echo-1"}},
        "providers": {"local": {"adapter": "openai", "base_url": model_url + "/v1", "max_retries": 0}},
        "replies": {"update_interval": 0.2},
        "worker": {"shutdown_grace": 2.0},
    }
    for section, values in over.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return Settings.model_validate(data)


@pytest.fixture
def settings(dev_pds: DevPds, pds_account: AccountInfo, tmp_path: Path, model_server: ModelServer) -> Settings:
    return make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url)


@pytest.fixture
async def app(dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str]) -> AsyncIterator[App]:
    async with PdsClient(dev_pds.pds_url) as c:
        await c.login(pds_account.handle, pds_account.password)
        yield App(c, keyring[0], keyring[1])


#: the runtime each running_worker() runs in, by id() of its worker
_RUNTIMES: dict[int, Runtime] = {}


@asynccontextmanager
async def running_worker(
    settings: Settings, account: AccountInfo, keyring: Keyring, **kw: Any
) -> AsyncIterator[Worker]:
    """A worker running its real loop (``gelbridge run``'s runtime: backfill + firehose) in
    this event loop; ``kw`` are the worker's own seams (``store=``, ``pds=``, ``registry=`` ...)."""

    def factory(s: Settings, **given: Any) -> Worker:
        return Worker(s, **{**given, "keyring": keyring, **kw})

    runtime = Runtime(settings, environ={PASSWORD_ENV: account.app_password}, worker_factory=factory,
                      store=kw.get("store"))
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(runtime.run(stop, ready=ready))
    worker: Worker | None = None
    try:
        done, _ = await asyncio.wait({task, asyncio.create_task(ready.wait())}, timeout=60,
                                     return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        assert ready.is_set(), "worker did not get ready within 60 s"
        [served] = runtime.router
        worker = served.worker
        _RUNTIMES[id(worker)] = runtime
        src = runtime.intake.source_of(worker.did)
        if src is not None:
            await asyncio.wait_for(src.connected.wait(), 30)
        yield worker
    finally:
        if worker is not None:
            _RUNTIMES.pop(id(worker), None)
        stop.set()
        await asyncio.wait_for(task, 60)


def source_of(worker: Worker) -> Any:
    """The event source following ``worker``'s account (in its running_worker())."""
    return _RUNTIMES[id(worker)].intake.source_of(worker.did)


def http_of(worker: Worker) -> Any:
    """The health/metrics server of ``worker``'s process, once it listens (else None)."""
    watched = _RUNTIMES[id(worker)].watched
    return watched.http if watched is not None else None
