"""The worker: watch the account's repo, claim replies, run turns, write sealed replies.

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
- ``watch``: the sources ``[watch]`` asks for, built for a set of workers, and where
  their records, gaps and reconnects go (for ``Bridge.run``, the one orchestrator);
- ``service``: :class:`Worker` (start-up, ``handle_event``, backfill, recovery sweep,
  shutdown; ``run`` is ``Bridge.around(worker).run``);
- ``status``: what ``gelbridge status`` shows, for every account;
- ``offline``: the same turn on a record file (``gelbridge reply`` / ``convert``).

See docs/worker.md.
"""

from gelbridge._worker.decide import Ask, ask_of, decide_existing_reply
from gelbridge._worker.service import BackfillReport, Worker
from gelbridge._worker.status import status_report

__all__ = ["Ask", "BackfillReport", "Worker", "ask_of", "decide_existing_reply", "status_report"]
