"""Fixtures for the transport tests: a loopback provider and a closed port."""

from transport_server import closed_port, provider  # noqa: F401  (pytest fixtures)
