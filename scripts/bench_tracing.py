"""What tracing costs per turn, side by side in one run: the spans of one turn (the turn,
two model calls, one tool, six PDS calls) with traces off (the shared no-op) and on (the
OpenTelemetry SDK, batch processor, an exporter that drops the spans). Medians of
repeated rounds, in microseconds per turn.

Usage: .venv/bin/python scripts/bench_tracing.py [--turns 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from gelbridge import _tracing as tracing

PDS_CALLS, MODEL_CALLS, TOOLS = 6, 2, 1


def one_turn() -> None:
    with tracing.span("gelbridge.turn", {"gelbridge.account": "a", "gelbridge.reply.rkey": "3mk.r0"}) as sp:
        for _ in range(PDS_CALLS):
            with tracing.span("pds putRecord", {"rpc.method": "com.atproto.repo.putRecord"}, client=True):
                pass
        for _ in range(MODEL_CALLS):
            with tracing.span("chat m", {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"},
                              client=True) as c:
                if c is not None:
                    c.set_attribute("gen_ai.usage.input_tokens", 10)
        for _ in range(TOOLS):
            with tracing.span("execute_tool t", {"gen_ai.tool.name": "t"}):
                pass
        if sp is not None:
            sp.set_attribute("gelbridge.turn.status", "complete")


def per_turn_us(turns: int, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(turns):
            one_turn()
        times.append((time.perf_counter() - t0) / turns * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    off = per_turn_us(a.turns, a.rounds)
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracing.configure(SimpleNamespace(traces=True, service_name="bench", otlp_endpoint=None), exporter=Drop())
    on = per_turn_us(a.turns, a.rounds)
    tracing.shutdown()
    n = 1 + PDS_CALLS + MODEL_CALLS + TOOLS
    print(f"spans per turn: {n}; median of {a.rounds} rounds of {a.turns} turns")
    print(f"  traces off (no-op)   {off:8.2f} µs per turn")
    print(f"  traces on  (SDK)     {on:8.2f} µs per turn  ({on / n:.1f} µs a span)")


if __name__ == "__main__":
    main()
