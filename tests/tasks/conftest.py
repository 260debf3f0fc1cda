"""Fixtures of the tasks tests: one local Ray per module (the tiny-model profile is in tests/conftest.py)."""

from __future__ import annotations

import pytest
import ray


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
