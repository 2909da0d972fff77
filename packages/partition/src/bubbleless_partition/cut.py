"""``cut(profile, num_stages=..., method=...)``: one entry point, one table from method name to algorithm."""

from __future__ import annotations

from .contiguous import cut_dp, cut_params, cut_uniform
from .greedy_band import cut_greedy_band
from .layers import Profile
from .partition import Partition
from .roundrobin import cut_roundrobin
from .vshape import cut_v

METHODS = {
    "uniform": cut_uniform,
    "params": cut_params,
    "dp": cut_dp,
    "v": cut_v,
    "roundrobin": cut_roundrobin,
    "greedy-band": cut_greedy_band,
    # "auto" is the optimal contiguous cut: V and round-robin layouts change what a stage is, so the
    # caller (which knows its schedule) asks for them by name.
    "auto": cut_dp,
}


def cut(profile: Profile, *, num_stages: int, method: str = "auto", memory_cap: float | None = None,
        num_microbatches: int | None = None) -> Partition:
    """Cut the profile's layers into ``num_stages`` runs of consecutive layers.

    ``num_stages``: stages (chunks) in all; ``"v"`` puts two on each rank, ``"roundrobin"`` counts
    backward groups. ``memory_cap``: bytes a stage (a rank for ``"v"``, a group for round-robin) may
    need, as ``Profile.layer_memory`` counts them. ``num_microbatches``: round-robin only, how many
    micro-batches share one weight upload (default ``num_stages + 1``, RoundPipe's default of workers + 1
    with one worker per backward group).
    """
    if method not in METHODS:
        raise ValueError(f"unknown partition method {method!r}; choose one of {sorted(METHODS)}")
    if not isinstance(profile, Profile):
        raise ValueError(f"cut() takes a Profile, got {type(profile).__name__}")
    if not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be a positive int, got {num_stages!r}")
    if num_stages > profile.num_layers:
        raise ValueError(
            f"num_stages={num_stages} is more than the {profile.num_layers} layers in the profile; use at most "
            f"{profile.num_layers} stages, or profile the model at a finer grain (every stage needs a layer)"
        )
    if memory_cap is not None and (not isinstance(memory_cap, (int, float)) or not memory_cap > 0):
        raise ValueError(f"memory_cap must be a positive number of bytes or None, got {memory_cap!r}")
    if num_microbatches is None:
        num_microbatches = num_stages + 1
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be a positive int, got {num_microbatches!r}")
    return METHODS[method](profile, num_stages=num_stages, memory_cap=memory_cap, num_microbatches=num_microbatches)
