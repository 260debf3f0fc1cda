"""Fixtures of the tasks tests: one private Ray per module, started as a round starts it (loopback only, token
auth); the tiny-model profile is in tests/conftest.py."""

from __future__ import annotations

import pytest

from jacobi_forcing.infra.ray_cluster import ray_session


@pytest.fixture(scope="module")
def ray_local():
    with ray_session(num_cpus=2) as session:
        yield session
