"""Where stages run: placement is its own pure function, separate from the action order."""

from __future__ import annotations


def _check(num_ranks: int, chunks: int) -> None:
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1, got {num_ranks}")
    if chunks < 1:
        raise ValueError(f"stages per rank must be at least 1, got {chunks}")


def loop_placement(num_ranks: int, stages_per_rank: int = 1) -> tuple[int, ...]:
    """Stage s on rank s mod p: 1F1B (one stage each) and interleaved 1F1B (v stages each)."""
    _check(num_ranks, stages_per_rank)
    return tuple(s % num_ranks for s in range(num_ranks * stages_per_rank))


def v_placement(num_ranks: int) -> tuple[int, ...]:
    """Two chunks per rank in a V: rank i holds stages i and 2p-1-i, so rank 0 holds the first and last."""
    _check(num_ranks, 2)
    return tuple(range(num_ranks)) + tuple(reversed(range(num_ranks)))
