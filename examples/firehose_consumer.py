"""Embed gelbridge in a synchronous firehose consumer (the atproto SDK's client).

Your consumer already follows a PDS (or relay) firehose and does its own work with each
message; it also hands every message to gelbridge, which answers chat.gel.assistant
messages of the accounts in the config. Cursor: saved every 200 messages, only after
everything fed so far is handled (claims durable).

    GELBRIDGE_APP_PASSWORD=... python examples/firehose_consumer.py gelbridge.toml wss://pds.example/xrpc
    (locally: ws://127.0.0.1:2583/xrpc)
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from atproto_firehose import FirehoseSubscribeReposClient

from gelbridge import Bridge


def main(config: str, base_uri: str, cursor_file: str = "firehose-cursor.json") -> None:
    saved = json.loads(Path(cursor_file).read_text()) if Path(cursor_file).exists() else {}
    params = {"cursor": saved["seq"]} if "seq" in saved else None
    client = FirehoseSubscribeReposClient(params, base_uri=base_uri)
    bridge = Bridge.from_config(config).start_in_thread()  # logs in, starts the workers
    count = 0

    def on_message(message) -> None:  # noqa: ANN001 - atproto_subscription MessageFrame
        nonlocal count
        # ... your own processing of the message here ...
        bridge.feed_firehose_frame(message)  # filter + enqueue; blocks only when the bridge is full
        seq = message.body.get("seq") if isinstance(message.body, dict) else None
        count += 1
        if isinstance(seq, int) and count % 200 == 0 and bridge.join_sync(timeout=30):
            Path(cursor_file).write_text(json.dumps({"seq": seq}))
            client.update_params({"cursor": seq})  # the SDK reconnects with its params

    signal.signal(signal.SIGTERM, lambda *_: client.stop())
    try:
        client.start(on_message)  # blocks until stop(); reconnects by itself
    except KeyboardInterrupt:
        client.stop()
    finally:
        bridge.close()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
