"""Fixtures: adapter scripts of this directory, a ModelServer, settings and clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from gelbridge._adapters.client import ModelClient
from gelbridge._adapters.registry import AdapterRegistry
from gelbridge._adapters.sandbox import SandboxLimits
from gelbridge._config import Settings
from gelbridge._dev.model_server import ModelServer
from testkit.adapter_helpers import SCRIPTS, settings_for


@pytest.fixture(scope="session")
def registry() -> AdapterRegistry:
    """Only the test scripts (never the built-ins, which another suite covers)."""
    reg = AdapterRegistry.load(None, [SCRIPTS], limits=SandboxLimits(pool_size=2))
    failed = [e for e in reg.entries() if e.status == "failed"]
    assert not failed, failed
    return reg


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    with ModelServer(api_key="sk-test", chunk_size=4) as srv:
        yield srv


@pytest.fixture
def make_client(registry: AdapterRegistry) -> Iterator[Callable[..., ModelClient]]:
    made: list[ModelClient] = []

    def make(settings: Settings, env: dict[str, str] | None = None) -> ModelClient:
        c = ModelClient(settings, registry=registry, env=env if env is not None else {"TEST_KEY": "sk-test"})
        made.append(c)
        return c

    yield make


@pytest.fixture
async def openai_client(model_server: ModelServer, make_client: Callable[..., ModelClient]) -> AsyncIterator[ModelClient]:
    settings = settings_for(local={"adapter": "openai_md", "base_url": model_server.url, "api_key_env": "TEST_KEY",
                                   "max_retries": 2})
    client = make_client(settings)
    try:
        yield client
    finally:
        await client.aclose()

