"""zbv-mem's cut, from a measurement: the fastest V cut at torch 1F1B's memory.

"The same memory" here: no rank of the V holds more bytes saved for backward at once than torch's
Schedule1F1B holds on its busiest rank, on its even cut. Among the V cuts that meet it, the one whose
step the simulator predicts shortest under the layers' measured costs is zbv-mem's.

- Costs: ``bubbleless_partition.profile`` times every layer's F, I and W on one micro-batch, where the
  run's processes will (one process, the scenario's torch threads); ``stage_costs`` sums them per stage.
  The profile's I and W are two autograd passes, so their sum overstates a fused backward; it does so
  for every layer alike, which is what choosing between cuts needs.
- Memory: the bytes a layer's forward saves for backward (the profile's count, autograd's own hooks,
  weights excluded: ``bubbleless_partition.saved_tensors.SavedStorages``) do not depend on timing, so the memory test is exact on a loaded machine. A rank's peak is
  its actions walked in order: F adds its stage's bytes, W (or B) frees them. I frees nothing: the
  runtime's deferred weight gradients keep each linear's input until W, so this over-counts a little
  and never under-counts.
- Every V cut is tried (``layers + 2`` layers into ``2 x workers`` stages: 35 on the tiny model), so the
  answer is exact for the profile; ties go to the smaller peak, then the earlier cut.

The profile is measured once per run, in the parent process before the first round, and the cut goes
to every worker in the scenario (``Scenario.zbv_mem_cut``), so every rank and every round uses one cut
and the record says which (``cut_record``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, combinations, pairwise

from .scenario import Scenario


@dataclass(frozen=True)
class VCut:
    """The chosen cut and what it was chosen on."""

    sizes: tuple[int, ...]
    """Layers per stage (stage order; the V puts stages r and 2p-1-r on rank r)."""
    predicted_ms: float
    """The simulator's step of zbv on this cut under the profiled costs."""
    peaks: tuple[int, ...]
    """Bytes saved for backward at once, per rank, on this cut."""
    limit: int
    """torch 1F1B's busiest rank's peak, on its even cut: no rank may exceed it."""
    baseline_ms: float
    """The simulator's step of 1F1B on the even cut under the same costs."""
    candidates: int
    """V cuts that met the memory limit (of all ``layers choose stages`` cuts)."""

    def as_dict(self) -> dict:
        return {"sizes": list(self.sizes), "predicted_ms": self.predicted_ms, "peaks": list(self.peaks),
                "limit": self.limit, "baseline_ms": self.baseline_ms, "candidates": self.candidates}


def compositions(n: int, k: int):
    """Every way to cut ``n`` layers into ``k`` non-empty contiguous stages, as sizes."""
    for cuts in combinations(range(1, n), k - 1):
        yield tuple(b - a for a, b in pairwise((0, *cuts, n)))


def rank_peaks(schedule, stage_bytes) -> tuple[int, ...]:
    """Per rank, the most bytes saved for backward at once: F adds its stage's, W and B free them."""
    from bubbleless_schedules import Kind

    peaks = []
    for row in schedule.actions:
        held = peak = 0
        for action in row:
            if action.kind is Kind.F:
                held += stage_bytes[action.stage]
            elif action.kind in (Kind.W, Kind.B):
                held -= stage_bytes[action.stage]
            peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


def _per_stage(values, sizes) -> list:
    bounds = (0, *accumulate(sizes))
    return [sum(values[a:b]) for a, b in pairwise(bounds)]


def choose_v_cut(layer_costs, layer_bytes, *, workers: int, microbatches: int) -> VCut:
    """The V cut of least simulated zbv step whose every rank's peak is within torch 1F1B's busiest.

    ``layer_costs``: a ``bubbleless_partition.Profile`` (per-layer F, I, W); ``layer_bytes``: bytes each
    layer's forward saves for backward, one micro-batch. Pure: the same inputs give the same cut."""
    from bubbleless_runtime.auto_partition import stage_costs
    from bubbleless_schedules import generate, simulate

    n = len(layer_bytes)
    if n % workers:
        raise ValueError(f"{n} layers do not cut evenly over {workers} ranks for torch's 1F1B; "
                         "give the model layers + 2 divisible by workers")
    even = [n // workers] * workers
    one_f_one_b = generate("1f1b", num_ranks=workers, num_microbatches=microbatches)
    limit = max(rank_peaks(one_f_one_b, _per_stage(layer_bytes, even)))
    zbv = generate("zbv", num_ranks=workers, num_microbatches=microbatches)
    fits = []
    for sizes in compositions(n, 2 * workers):
        peaks = rank_peaks(zbv, _per_stage(layer_bytes, sizes))
        if max(peaks) <= limit:
            fits.append((simulate(zbv, stage_costs(layer_costs, sizes)).makespan, max(peaks), sizes, peaks))
    if not fits:
        raise ValueError(f"no V cut of {n} layers over {workers} ranks keeps every rank within torch 1F1B's "
                         f"{limit:,} bytes; measure zbv on the even cut instead")
    makespan, _, sizes, peaks = min(fits)
    return VCut(sizes, makespan, peaks, limit, simulate(one_f_one_b, stage_costs(layer_costs, even)).makespan,
                len(fits))


def measured_v_cut(scenario: Scenario, *, repeats: int = 9) -> VCut:
    """Profile the scenario's layers on one micro-batch and choose zbv-mem's cut (``choose_v_cut``)."""
    import torch

    from bubbleless_partition import profile

    from .tiny import batch, make_layers

    threads = torch.get_num_threads()
    torch.set_num_threads(scenario.threads)  # as each rank will run
    try:
        layers = make_layers(scenario)
        x, _ = batch(scenario, 0)
        sample = x[:scenario.micro_batch]
        costs = profile(layers, sample, repeats=repeats, warmup=2, name=f"{scenario.name} layers")
    finally:
        torch.set_num_threads(threads)
    # the profile's count: each storage autograd keeps once, weights left out (``SavedStorages``), on a
    # micro-batch that owns its storage (a slice of the batch would count the whole batch's ids)
    layer_bytes = [round(c.activation_bytes_per_token * costs.tokens_per_microbatch) for c in costs.layers]
    return choose_v_cut(costs, layer_bytes, workers=scenario.workers, microbatches=scenario.microbatches)


def with_measured_cut(scenario: Scenario) -> tuple[Scenario, VCut | None]:
    """The scenario with ``zbv_mem_cut`` set from a measurement when it runs zbv-mem and none is given."""
    if "zbv-mem" not in scenario.systems or scenario.zbv_mem_cut is not None:
        return scenario, None
    found = measured_v_cut(scenario)
    return scenario.with_(zbv_mem_cut=found.sizes), found
