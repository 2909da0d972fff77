"""spawn: results in rank order, and a child's exception comes back with its own type and traceback."""

from __future__ import annotations

import pytest

from bubbleless_runtime import spawn
from bubbleless_runtime._testing.ranks import fail_on_rank


@pytest.mark.slow
def test_rt_spawn_returns_results_and_propagates_child_exceptions():
    assert spawn(fail_on_rank, 2, None, threads_per_process=1, timeout=60) == [0, 1]
    with pytest.raises(KeyError, match="broken on purpose") as info:
        spawn(fail_on_rank, 2, 1, threads_per_process=1, timeout=60)
    assert "fail_on_rank" in str(info.value.__cause__)  # the child's traceback
    assert "rank 1" in "".join(getattr(info.value, "__notes__", []))


def test_rt_spawn_rejects_a_bad_process_count():
    with pytest.raises(ValueError, match="nproc must be a positive integer"):
        spawn(fail_on_rank, 0)
