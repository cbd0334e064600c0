"""Run the local multi-provider model server in the foreground: an alias of
``gelbridge dev model --mode echo --port 0`` (any of its options go through; later ones win).

    .venv/bin/python scripts/run_model_server.py --port 8765 [--api-key KEY] [--chunk-size 8] [--mode tools] [--models a,b]

Prints one JSON line with its URL and a [providers.*] table per wire format; Ctrl-C stops it.
"""

from __future__ import annotations

import sys

from gelbridge._cli import main

if __name__ == "__main__":
    sys.argv = ["gelbridge", "dev", "model", "--mode", "echo", "--port", "0", *sys.argv[1:]]
    main()
