"""Two revisions of one streaming reply are never closer than ``[replies] update_interval``
on the real PDS, even when its writes are slow (issue 23: an atproto SDK app saw
progress writes 1.04 s apart with ``update_interval = 2``: the interval was counted
from when the previous write was sent, so a slow write shortened the next gap).

The worker's PDS client is the real one, with a delay before each progress write (a PDS
under load) and the times every write of the reply was sent and answered kept (the
client seam: bounded and exact, where polling the record would miss revisions).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from gelbridge._dev.model_server import ModelServer, Turn
from gelbridge._dev.pds import AccountInfo, DevPds
from gelbridge._pds import PdsClient, PutResult
from gelbridge._records import new_tid
from gelbridge._sealing import Keyring

from .conftest import App, make_settings, running_worker, text_of

pytestmark = [pytest.mark.pds, pytest.mark.timeout(120)]

INTERVAL = 1.0
SLOW = 0.5  # added before each progress write


class SlowProgressPds(PdsClient):
    """The real client; progress writes (not claims, not final writes) take ``SLOW`` s
    longer; ``writes`` keeps (status, sent, answered) of every reply write."""

    writes: list[tuple[str, float, float]]

    async def put_record(self, collection: str, rkey: str, record: Any, **kw: Any) -> PutResult:
        sent = time.monotonic()
        if record.get("role") == "assistant" and not kw.get("must_land"):
            await asyncio.sleep(SLOW)
        res = await super().put_record(collection, rkey, record, **kw)
        if record.get("role") == "assistant":
            self.writes.append((record["status"], sent, time.monotonic()))
        return res


async def test_revisions_of_a_streaming_reply_are_at_least_the_interval_apart_on_a_slow_pds(
    dev_pds: DevPds, pds_account: AccountInfo, keyring: tuple[Keyring, str], app: App,
    model_server: ModelServer, tmp_path: Path,
) -> None:
    settings = make_settings(dev_pds.pds_url, pds_account, tmp_path / "state", model_server.url,
                             replies={"update_interval": INTERVAL})
    text = "word " * 100
    model_server.enqueue(Turn(text=text, chunk_size=5, chunk_delay=0.05))  # 100 chunks over ~5 s
    async with SlowProgressPds(dev_pds.pds_url) as pds:
        pds.writes = []
        await pds.login(pds_account.handle, pds_account.app_password)
        async with running_worker(settings, pds_account, keyring[0], pds=pds) as worker:
            k = await app.send("stream slowly", conversation=new_tid())
            _, content = await app.wait_status(f"{k}.r0", "complete", timeout=60)
            assert text_of(content) == text
            await worker.wait_idle(10)
    statuses = [s for s, _, _ in pds.writes]
    assert statuses[0] == "pending" and statuses[-1] == "complete", statuses
    assert statuses.count("streaming") >= 2, statuses  # the test saw gaps to measure
    for (_, _, landed), (status, sent, _) in zip(pds.writes, pds.writes[1:]):
        if status != "complete":  # the final write may come any time
            assert sent - landed >= INTERVAL - 0.01, pds.writes
