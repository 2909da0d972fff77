"""The memory-cap rule every method shares, and the error that tells the user which cap would fit."""

from __future__ import annotations

from collections.abc import Callable

from .partition import Partition


def describe_bytes(size: float) -> str:
    return f"{size:.0f} bytes ({size / 2**30:.3f} GiB)"


def cap_error(memory_cap: float, unit: str, smallest: float, num_stages: int) -> ValueError:
    """No cut into ``num_stages`` stages keeps every ``unit`` (stage, rank, group) under the cap."""
    return ValueError(
        f"memory_cap={memory_cap:.0f} is below what any cut into {num_stages} stages can meet: the smallest "
        f"cap that fits is {describe_bytes(smallest)} per {unit}; raise memory_cap to at least that, use more "
        f"stages, or lower the profile's memory (fewer micro-batches in flight, state offloaded)"
    )


def check_cap(partition: Partition, memory_cap: float | None, method: str, smallest: Callable[[], float]) -> None:
    """Raise if a fixed-rule cut breaks the cap, saying whether any cut could meet it."""
    if memory_cap is None:
        return
    worst = max(partition.rank_memory)
    if worst <= memory_cap:
        return
    floor = smallest()
    if floor > memory_cap:
        raise cap_error(memory_cap, "rank", floor, partition.num_stages)
    raise ValueError(
        f"the {method!r} cut needs {describe_bytes(worst)} on its largest rank, over memory_cap={memory_cap:.0f}; "
        f"method='dp' (or 'v' for V placement) finds a cut under the cap, whose smallest feasible value is "
        f"{describe_bytes(floor)}"
    )
