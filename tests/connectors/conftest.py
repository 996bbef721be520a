"""Fixtures for connector tests: fast retries, and the S3 markers.

The local S3 fixtures (``s3_endpoint``, ``s3``) live in ``tests/conftest.py``, shared with the
end-to-end tests: a real moto server in a subprocess on 127.0.0.1 (``s3_server.py``), wrapped in a
fault-injecting middleware, reset between tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.retry import RetryPolicy, set_default_retry_policy


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "s3: needs a local S3 (moto server subprocess on 127.0.0.1)")
    config.addinivalue_line("markers", "s3_faults: S3 with injected faults (throttling, delays, cut bodies)")


@pytest.fixture(autouse=True)
def fast_retries() -> Iterator[RetryPolicy]:
    """Retries with millisecond backoff, so fault tests take milliseconds, not seconds."""
    policy = RetryPolicy(max_attempts=6, base_delay_s=0.005, max_delay_s=0.05)
    previous = set_default_retry_policy(policy)
    yield policy
    set_default_retry_policy(previous)
