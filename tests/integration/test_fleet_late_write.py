"""A late write after a fleet takeover never leaves a reply stuck at ``streaming``
(issue 23): the old holder's progress write, held on its way to the real PDS, lands after
the new holder read the record; the new holder's next write fails ``InvalidSwap``, and it
must re-read the record and go on, since the lease (PostgreSQL) says the reply is its."""

from __future__ import annotations

from pathlib import Path

import pytest

from gelbridge._dev.pds import AccountInfo, DevPds

from .late_write import B_TEXT, late_write

pytestmark = [pytest.mark.pds, pytest.mark.postgres, pytest.mark.timeout(180)]


async def test_the_new_holder_finishes_a_reply_the_old_holders_late_write_changed(
    tmp_path: Path, dev_pds: DevPds, pds_account: AccountInfo, postgres_url: str,
) -> None:
    run = await late_write(tmp_path, dev_pds.pds_url, postgres_url, pds_account)
    assert run.landed_late  # the attack happened: A's write landed (HTTP 200) after B had read the reply
    assert run.status == "complete", run
    assert run.text == B_TEXT
    assert run.claim == ("complete", None)
    assert run.outcomes == ["complete"]
    assert run.replies == 1
