"""What a cut returns, priced layer by layer from the profile (not from the searches' prefix sums)."""

from __future__ import annotations

from dataclasses import dataclass

from .layers import Profile
from .minmax import boundaries_of


@dataclass(frozen=True, kw_only=True)
class Partition:
    """Stages as runs of consecutive layers, with what each costs per micro-batch and needs in memory.

    For ``method="roundrobin"`` this is the forward grouping and ``backward`` the backward one; both end
    with the same fused group (forward, loss and backward of the last layers in one job).
    """

    method: str
    """The method that produced it (``"dp"``, ``"v"``, ...)."""
    sizes: tuple[int, ...]
    """Layers per stage, in stage order: what the runtime's ``partition=`` argument takes."""
    stage_costs: tuple[float, ...]
    """ms per micro-batch for each stage: compute plus the sends at its cuts to other ranks (round-robin:
    the job's time per micro-batch, compute or weight upload, whichever is longer)."""
    stage_memory: tuple[float, ...]
    """Device bytes each stage needs (``Profile.layer_memory`` summed)."""
    stage_to_rank: tuple[int, ...]
    """Rank of each stage: stage s on rank s for contiguous cuts, a V for ``"v"``. Round-robin jobs run on
    whichever worker is free; their entries count jobs, not devices."""
    ideal: float
    """Perfect balance: the total compute divided evenly over the ranks (round-robin: over the jobs)."""
    backward: Partition | None = None
    """Round-robin only: the backward grouping."""

    @property
    def num_stages(self) -> int:
        return len(self.sizes)

    @property
    def boundaries(self) -> tuple[int, ...]:
        """``(0, b1, ..., num_layers)``: stage s holds layers ``range(boundaries[s], boundaries[s+1])``."""
        return boundaries_of(self.sizes)

    def layers_of(self, stage: int) -> range:
        b = self.boundaries
        return range(b[stage], b[stage + 1])

    @property
    def num_ranks(self) -> int:
        return max(self.stage_to_rank) + 1

    def _per_rank(self, values: tuple[float, ...]) -> tuple[float, ...]:
        totals = [0.0] * self.num_ranks
        for stage, value in enumerate(values):
            totals[self.stage_to_rank[stage]] += value
        return tuple(totals)

    @property
    def rank_costs(self) -> tuple[float, ...]:
        return self._per_rank(self.stage_costs)

    @property
    def rank_memory(self) -> tuple[float, ...]:
        return self._per_rank(self.stage_memory)

    @property
    def bottleneck(self) -> float:
        """The slowest rank's time per micro-batch (round-robin: the slowest job of either grouping)."""
        worst = max(self.rank_costs)
        return worst if self.backward is None else max(worst, self.backward.bottleneck)

    @property
    def ratio(self) -> float:
        """bottleneck / ideal: 1.0 is a perfect balance."""
        return self.bottleneck / self.ideal if self.ideal > 0 else 1.0

    def summary(self) -> str:
        lines = [f"{self.method}: sizes {list(self.sizes)}, slowest {self.bottleneck:.3f} ms, "
                 f"ideal {self.ideal:.3f} ms, ratio {self.ratio:.4f}"]
        if self.backward is not None:
            lines.append(f"  backward sizes {list(self.backward.sizes)}")
        return "\n".join(lines)


def _check_sizes(profile: Profile, sizes) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"stage sizes must be positive layer counts, got {list(sizes)}")
    if sum(sizes) != profile.num_layers:
        raise ValueError(f"stage sizes {list(sizes)} add up to {sum(sizes)}, the profile has {profile.num_layers} layers")
    return sizes


def price_pipeline(profile: Profile, sizes, *, method: str, stage_to_rank=None) -> Partition:
    """Price a stage-bound cut: each stage pays F+I+W of its layers and a send at each cut to another rank."""
    sizes = _check_sizes(profile, sizes)
    ranks = tuple(range(len(sizes))) if stage_to_rank is None else tuple(stage_to_rank)
    bounds = boundaries_of(sizes)
    costs, memory = [], []
    for s in range(len(sizes)):
        start, stop = bounds[s], bounds[s + 1]
        cost = sum(profile.layers[i].train_time for i in range(start, stop))
        if s > 0 and ranks[s - 1] != ranks[s]:
            cost += profile.cut_transfer_time(start)
        if s + 1 < len(sizes) and ranks[s + 1] != ranks[s]:
            cost += profile.cut_transfer_time(stop)
        costs.append(cost)
        memory.append(sum(profile.layer_memory(i) for i in range(start, stop)))
    num_ranks = max(ranks) + 1
    return Partition(
        method=method, sizes=sizes, stage_costs=tuple(costs), stage_memory=tuple(memory),
        stage_to_rank=ranks, ideal=profile.total_train_time / num_ranks,
    )


def roundrobin_job_time(profile: Profile, start: int, stop: int, kind: str, num_microbatches: int) -> float:
    """ms per micro-batch of one round-robin job over layers ``[start, stop)``.

    A job runs all micro-batches of its group on one worker while the next job's weights prefetch, so its
    time per micro-batch is the longer of the compute and the weight upload spread over the micro-batches.
    ``kind``: ``"forward"`` (F), ``"backward"`` (R+I+W: backward groups recompute their forward) or
    ``"fused"`` (F+I+W: the last group runs forward, loss and backward with no recompute).
    """
    layers = profile.layers[start:stop]
    compute = {
        "forward": lambda layer: layer.forward,
        "backward": lambda layer: layer.recompute + layer.input_grad + layer.weight_grad,
        "fused": lambda layer: layer.train_time,
    }[kind]
    work = sum(compute(layer) for layer in layers)
    return max(work, profile.upload_time(start, stop) / num_microbatches)


def price_roundrobin(profile: Profile, forward_sizes, backward_sizes, *, num_microbatches: int) -> Partition:
    """Price both round-robin groupings; their last groups must be the same fused group."""
    forward_sizes = _check_sizes(profile, forward_sizes)
    backward_sizes = _check_sizes(profile, backward_sizes)
    if forward_sizes[-1] != backward_sizes[-1]:
        raise ValueError(
            f"the last forward group ({forward_sizes[-1]} layers) and the last backward group "
            f"({backward_sizes[-1]}) must be the same fused group"
        )

    def groups(sizes, kind):
        bounds = boundaries_of(sizes)
        kinds = [kind] * (len(sizes) - 1) + ["fused"]
        costs = tuple(roundrobin_job_time(profile, bounds[g], bounds[g + 1], kinds[g], num_microbatches)
                      for g in range(len(sizes)))
        memory = tuple(sum(profile.layer_memory(i) for i in range(bounds[g], bounds[g + 1]))
                       for g in range(len(sizes)))
        return costs, memory

    f_costs, f_memory = groups(forward_sizes, "forward")
    b_costs, b_memory = groups(backward_sizes, "backward")
    jobs = len(forward_sizes) + len(backward_sizes) - 1  # the fused job is in both groupings
    ideal = (sum(f_costs) + sum(b_costs) - f_costs[-1]) / jobs
    backward = Partition(
        method="roundrobin", sizes=backward_sizes, stage_costs=b_costs, stage_memory=b_memory,
        stage_to_rank=tuple(range(len(backward_sizes))), ideal=ideal,
    )
    return Partition(
        method="roundrobin", sizes=forward_sizes, stage_costs=f_costs, stage_memory=f_memory,
        stage_to_rank=tuple(range(len(forward_sizes))), ideal=ideal, backward=backward,
    )
