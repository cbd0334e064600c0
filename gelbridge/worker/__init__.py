"""The worker: watch the account's repo, claim replies, run turns, write sealed replies.

- ``decide``: pure decisions (is a record a request, what to do with an existing reply);
- ``repo``: the in-memory view of message records and the lazy thread walk;
- ``writer``: sealed reply writes (claim, throttled progress, final);
- ``turn``: one turn, from claim to final write;
- ``scheduler``: per-conversation order, bounded concurrency, regeneration cancels;
- ``sources``: firehose (durable cursor, reconnect) and poll;
- ``service``: :class:`Worker` (start-up, ``handle_event``, backfill, recovery, shutdown)
  and ``status_report``.

See docs/worker.md.
"""

from gelbridge.worker.decide import Ask, ask_of, decide_existing_reply
from gelbridge.worker.service import BackfillReport, Worker, load_keyring, status_report

__all__ = ["Ask", "BackfillReport", "Worker", "ask_of", "decide_existing_reply", "load_keyring", "status_report"]
