"""Data parallelism across pipeline replicas: 2 stages x 2 replicas on 4 gloo ranks."""

from __future__ import annotations

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime._testing.ranks import data_parallel_2x2


@pytest.mark.slow
def test_rt_dp_2x2_averages_gradients_across_replicas():
    names = ["1f1b", "zb-h1", "zbv"]
    per_rank = spawn(data_parallel_2x2, 4, names, threads_per_process=1, timeout=120)
    for rank, errors in enumerate(per_rank):
        assert set(errors) == set(names)
        for name, error in errors.items():
            assert error <= 1e-5, (rank, name, error)
