"""OpenTelemetry traces, when ``[observability] traces = true`` and the ``otel`` extra is
installed (``pip install 'gelbridge[otel]'``); off, every span is a shared no-op.

One span per turn (``gelbridge.turn``) with child spans for each model call (``chat
{model}``, the OpenTelemetry GenAI semantic conventions: ``gen_ai.operation.name``,
``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.*``, ``gen_ai.response.finish_reasons``), each tool run (``execute_tool
{tool}``) and each PDS call (``pds {method}``). Exported with OTLP over HTTP
(``[observability] otlp_endpoint``) by a batch processor off the event loop's path.

No attribute, span name or event holds content: no prompt or reply text, no tool input
or output, no provider error body (an error is recorded by its kind only, never with
``record_exception``), no tool name the model made up (``unknown``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gelbridge._errors import REPLY_ERROR_KINDS, ConfigError

log = logging.getLogger("gelbridge.tracing")

_tracer: Any = None  # an opentelemetry Tracer while traces are on
_provider: Any = None
_NOOP = contextlib.nullcontext(None)

#: gen_ai.provider.name by built-in adapter (the conventions' well-known values)
GENAI_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini", "deepseek": "deepseek",
                   "ollama": "ollama", "openai-responses": "openai", "openrouter": "openrouter"}

EXTRA_HINT = "[observability] traces = true needs the otel extra: pip install 'gelbridge[otel]'"


def available() -> bool:
    """Whether the OpenTelemetry SDK and OTLP exporter are installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def configure(obs: Any, *, exporter: Any = None) -> bool:
    """Turn traces on for this process as ``obs`` (an ``ObservabilityConfig``) says; once
    on, later calls keep the first setup. ``exporter`` replaces the OTLP exporter (tests).
    Raises ConfigError when traces are asked for and the extra is missing."""
    global _tracer, _provider
    if not obs.traces or _tracer is not None:
        return _tracer is not None
    if not available():
        raise ConfigError(EXTRA_HINT)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # a provider of our own, not the global one: a host application keeps its own setup
    _provider = TracerProvider(resource=Resource.create({"service.name": obs.service_name}))
    _provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=obs.otlp_endpoint)))
    _tracer = _provider.get_tracer("gelbridge")
    log.info("OpenTelemetry traces on (OTLP/HTTP %s)", obs.otlp_endpoint or "default endpoint")
    return True


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still buffered (bounded)."""
    if _provider is not None:
        _provider.force_flush(int(timeout_s * 1000))


def shutdown() -> None:
    """Flush and turn traces off again."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def active() -> bool:
    """Whether traces are on in this process."""
    return _tracer is not None


def span(name: str, attributes: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None, *,
         client: bool = False) -> Any:
    """A context manager: the current span's child named ``name`` (yields the span), or a
    shared no-op yielding None while traces are off (the hot path: no allocation).
    ``attributes`` may be a function, called only when traces are on."""
    if _tracer is None:
        return _NOOP
    return _span(name, attributes() if callable(attributes) else attributes, client)


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any] | None, client: bool) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
    with _tracer.start_as_current_span(name, kind=kind, attributes=dict(attributes or {}),
                                       record_exception=False, set_status_on_exception=False) as sp:
        try:
            yield sp
        except BaseException as e:
            failed(sp, getattr(e, "kind", None) or type(e).__name__)
            raise


def failed(sp: Any, kind: str) -> None:
    """Mark ``sp`` failed with gelbridge's own word for it (``error.type``, one of the reply
    error kinds or an exception class name of ours), never a message or a provider's word."""
    if sp is None:
        return
    from opentelemetry.trace import Status, StatusCode

    word = str(kind)
    if word not in REPLY_ERROR_KINDS and not (word.isidentifier() and word[:1].isupper()):
        word = "other"  # e.g. a provider's own error code passed through by an adapter
    sp.set_attribute("error.type", word)
    sp.set_status(Status(StatusCode.ERROR))
