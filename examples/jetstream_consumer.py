"""Embed gelbridge in an asyncio Jetstream consumer of your own.

Your consumer reads Jetstream (v1 ``/subscribe``, JSON text frames) for its own
purposes, e.g. several collections; it also hands every event to gelbridge. gelbridge's
filter drops everything that is not a chat.gel.assistant record of a configured account.
Cursor: ``time_us``, saved once what was fed is handled; on reconnect it is rewound by a
few seconds (replays are harmless: claims are create-only and the worker skips finished
replies).

    GELBRIDGE_APP_PASSWORD=... python examples/jetstream_consumer.py gelbridge.toml wss://jetstream2.us-east.bsky.network

(To let gelbridge run the Jetstream connection itself instead, set ``[watch] source =
"jetstream"`` and ``url``, and call ``await bridge.serve(stop)``.)
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import websockets

from gelbridge import Bridge, rewound, subscribe_url


async def main(config: str, jetstream: str, cursor_file: str = "jetstream-cursor.json") -> None:
    path = Path(cursor_file)
    cursor = json.loads(path.read_text())["time_us"] if path.exists() else None
    async with Bridge.from_config(config) as bridge:
        dids = list(bridge.accounts)  # the served accounts, known once logged in
        collections = ["chat.gel.assistant.*", "app.bsky.feed.post"]  # yours + gelbridge's
        delay = 1.0
        while True:
            url = subscribe_url(jetstream, collections=collections, dids=dids, cursor=rewound(cursor, 5))
            try:
                async with websockets.connect(url, max_size=8 * 1024 * 1024) as ws:
                    delay = 1.0
                    async for text in ws:
                        # ... your own processing of the event here ...
                        await bridge.wait_for_room(timeout=60)  # back-pressure on the loop
                        bridge.feed_jetstream_event(text)
                        time_us = json.loads(text).get("time_us")
                        if isinstance(time_us, int) and bridge.pending == 0:
                            cursor = time_us
                            path.write_text(json.dumps({"time_us": cursor}))
            except (OSError, websockets.ConnectionClosed, websockets.InvalidHandshake) as e:
                print(f"Jetstream disconnected ({type(e).__name__}); retrying in {delay:.0f} s", file=sys.stderr)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 60)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2]))
