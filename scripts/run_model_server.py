"""Run the local multi-provider model server in the foreground (echo model).

    .venv/bin/python scripts/run_model_server.py --port 8765 [--api-key KEY] [--chunk-size 8]

Then point an adapter at http://127.0.0.1:8765 (OpenAI: /v1, Anthropic: /, Gemini: /,
Ollama: /). Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import threading

from gelbridge._dev.model_server import ModelServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--api-key", default=None, help="require this key in each provider's auth header")
    parser.add_argument("--chunk-size", type=int, default=16, help="characters per streamed fragment")
    args = parser.parse_args()
    with ModelServer(port=args.port, api_key=args.api_key, chunk_size=args.chunk_size) as server:
        print(f"model server listening on {server.url} (Ctrl-C to stop)", flush=True)
        done = threading.Event()
        try:
            while not done.wait(3600):
                pass
        except KeyboardInterrupt:
            print("stopping", flush=True)


if __name__ == "__main__":
    main()
