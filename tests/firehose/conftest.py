"""A logged-in PdsClient for these tests."""

from testkit.pds_client import client  # noqa: F401 - a fixture
