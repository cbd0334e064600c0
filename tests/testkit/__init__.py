"""Helpers the tests share: record and Lux builders, schema checks, hypothesis strategies,
wire stand-ins (a Jetstream server, a parrot provider), the built-in adapters' harness
and worker fakes. Imported as ``testkit.<module>`` (``pythonpath = ["tests"]`` in
pyproject.toml); never ``sys.path`` edits."""
