"""The worker: one account's records in: claim replies, run turns, write sealed replies.

- ``decide``: pure decisions (is a record a request, what to do with an existing reply);
- ``repo``: the in-memory view of message records, the lazy thread walk, and the
  event-fed cache of conversation/settings records;
- ``writer``: sealed reply writes (claim, throttled progress, checkpoint before tools, final);
- ``resume``: where an unfinished reply picks up after a crash (its stored tool calls);
- ``timing``: per-turn PDS read time;
- ``turn``: one turn, from claim to final write;
- ``scheduler``: per-conversation order, bounded concurrency, regeneration cancels;
- ``sources``: the event-source contract; firehose (durable cursor, reconnect; one or
  several accounts) and poll;
- ``service``: :class:`Worker`, one account: start-up, ``handle_event`` (one
  ``IncomingRecord``), backfill, recovery sweep, shutdown. Which sources follow it and
  how a record reaches it is the runtime's (:mod:`gelbridge._runtime`);
- ``offline``: the same turn on a record file (``gelbridge reply`` / ``convert``).

See docs/worker.md.
"""

from gelbridge._worker.decide import Ask, ask_of, decide_existing_reply
from gelbridge._worker.service import BackfillReport, TurnSeams, Worker

__all__ = ["Ask", "BackfillReport", "TurnSeams", "Worker", "ask_of", "decide_existing_reply"]
