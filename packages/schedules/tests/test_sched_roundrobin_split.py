"""``roundrobin`` with per-layer costs may run the job that paces the step on two devices (a split job)."""

import pytest

from bubbleless_schedules import Costs, generate, simulate, validate
from bubbleless_schedules.generators import roundrobin_search
from bubbleless_schedules.generators.roundrobin_cut import job_costs
from bubbleless_schedules.generators.roundrobin_dispatch import JobTimes, list_dispatch, split_parts
from bubbleless_schedules.generators.roundrobin_search import dispatched, held_weights
from bubbleless_schedules.roundrobin_layout import PoolGroups, held_jobs, peak_weight_layers, pool_groups
from bubbleless_schedules.simulate import peak_memory
from bubbleless_schedules.simulate_steady import steady_state


def profile(layers: int, head: float, backward: float, comm: float = 0.1, load: float | None = None) -> Costs:
    """RoundPipe-like: F 1 per layer, B ``backward`` x F split evenly into I and W, the head last."""
    half = backward / 2
    moved = {} if load is None else {"load": [load] * (layers + 1), "store": [load] * (layers + 1)}
    return Costs([1.0] * layers + [head], [half] * layers + [head], [half] * layers + [head], comm, **moved)


HEAVY_HEAD = profile(16, 6.0, 2.2)
"""The fused LM-head group (F 6, B 12 per micro-batch) paces 8 devices: every gradient waits for it."""


def _split_jobs(schedule):
    devices = {}
    for d, row in enumerate(schedule.actions):
        for a in row:
            if a.microbatch is not None:
                devices.setdefault(a.stage, set()).add(d)
    return {job: sorted(where) for job, where in devices.items() if len(where) > 1}


def _variants(groups, layer_costs, m, split_job):
    return [dispatched(groups, layer_costs, num_devices=8, num_microbatches=m, ahead=look, next_ahead=na,
                       split_job=split_job)
            for look in (1, 2) for na in (0, m)]


def test_split_fused_group_validates_is_above_the_bound_and_beats_every_unsplit_dispatch():
    m = 8
    ours = generate("roundrobin", num_ranks=8, num_microbatches=m, layer_costs=HEAVY_HEAD)
    groups = pool_groups(ours)
    validate(ours)
    split_jobs = _split_jobs(ours)
    assert split_jobs == {groups.last_stage: split_jobs[groups.last_stage]}  # the fused group
    wide = len(split_jobs[groups.last_stage])
    assert wide >= 2
    timeline = simulate(ours, job_costs(HEAVY_HEAD, groups))
    work = sum(s.end - s.start for s in timeline.spans)
    assert timeline.makespan >= work / 8 - 1e-9
    unsplit = min(simulate(s, c).makespan for s, c, _ in _variants(groups, HEAVY_HEAD, m, None))
    split = [simulate(s, c).makespan for how in ("halves", "interleaved")
             for s, c, _ in _variants(groups, HEAVY_HEAD, m, ("last", how))]
    assert timeline.makespan < unsplit - 1e-9 and min(split) < unsplit - 1e-9
    # a split job uploads its weights once per device it runs on
    loads = sum(a.kind.value == "LOAD" for _, _, a in ours.all_actions())
    assert loads == groups.num_stages + sum(len(where) - 1 for where in split_jobs.values())


@pytest.mark.parametrize("how", ["halves", "interleaved"])
def test_split_parts_cover_every_micro_batch_once_on_two_devices(how):
    groups = pool_groups(generate("roundrobin", num_ranks=8, num_microbatches=7, layer_costs=HEAVY_HEAD))
    schedule, costs, makespan = dispatched(groups, HEAVY_HEAD, num_devices=8, num_microbatches=7, ahead=1,
                                           split_job=("last", how))
    validate(schedule)
    where = {}
    for d, row in enumerate(schedule.actions):
        for a in row:
            if a.stage == groups.last_stage and a.microbatch is not None:
                where.setdefault(a.microbatch, set()).add(d)
    assert sorted(where) == list(range(7)) and all(len(w) == 1 for w in where.values())
    assert len(set().union(*where.values())) == 2
    assert simulate(schedule, costs).makespan <= makespan + 1e-9  # the list scheduler's time is an upper bound


def test_uploads_that_cost_more_than_the_split_saves_keep_the_job_on_one_device():
    costly = profile(16, 6.0, 2.2, load=40.0)  # each layer's upload as long as 40 forward layers
    m = 8
    ours = generate("roundrobin", num_ranks=8, num_microbatches=m, layer_costs=costly)
    groups = pool_groups(ours)
    span = simulate(ours, job_costs(costly, groups)).makespan
    unsplit = min(simulate(s, c).makespan for s, c, _ in _variants(groups, costly, m, None))
    assert span <= unsplit + 1e-9  # judged with LOAD/STORE: never worse than the best unsplit order


def test_split_errors_say_what_to_change():
    groups = pool_groups(generate("roundrobin", num_ranks=8, num_microbatches=8, layer_costs=HEAVY_HEAD))
    times = JobTimes(*(tuple([1.0] * groups.num_stages),) * 3)
    with pytest.raises(ValueError, match="with round_size every round is a unit already"):
        list_dispatch(groups, times, 8, 8, 1, round_size=4, parts=split_parts(groups.last_stage, "halves", 8))
    with pytest.raises(ValueError, match="a split needs 2 or more micro-batches"):
        split_parts(0, "halves", 1)


def test_weight_limit_bounds_the_split_and_lifting_it_grows_the_fused_group():
    m = 16
    layer_costs = profile(64, 1.5, 2.1)  # qwen3-32b-like: 64 decoder layers and the head
    capped = generate("roundrobin", num_ranks=8, num_microbatches=m, layer_costs=layer_costs)
    free = generate("roundrobin", num_ranks=8, num_microbatches=m, layer_costs=layer_costs, weight_limit=65)
    for schedule in (capped, free):
        validate(schedule)
    spans = {name: simulate(s, job_costs(layer_costs, pool_groups(s))).makespan
             for name, s in (("capped", capped), ("free", free))}
    # the free one fuses more layers (no recompute for them) and splits that group over devices
    # (and maybe the backward jobs that run last, the drain, and the forward jobs that run first, the fill,
    # over more devices too)
    free_groups = pool_groups(free)
    assert free_groups.last > pool_groups(capped).last and free_groups.last_stage in _split_jobs(free)
    assert all(j >= free_groups.last_stage or free_groups.role(j) == "forward" for j in _split_jobs(free))
    assert spans["free"] < spans["capped"] - 1e-9
    assert max(peak_weight_layers(free)) > max(peak_weight_layers(capped))  # at the price of weights per device
    work = sum(s.end - s.start for s in simulate(free, job_costs(layer_costs, pool_groups(free))).spans)
    assert spans["free"] >= work / 8 - 1e-9


def test_weight_limit_errors_say_what_to_change():
    with pytest.raises(ValueError, match="weight_limit must be an integer >= 1"):
        generate("roundrobin", num_ranks=8, num_microbatches=8, layer_costs=HEAVY_HEAD, weight_limit=0)
    with pytest.raises(ValueError, match="weight_limit needs layer_costs="):
        generate("roundrobin", num_ranks=8, num_microbatches=8, weight_limit=4)
    # a weight limit no cut meets, with a memory limit too: the weight limit is what binds, and is named
    unit = Costs([1.0] * 16, [1.0] * 16, [1.0] * 16, 0.0)
    with pytest.raises(ValueError, match="weight_limit=1 layers of weights; raise weight_limit"):
        generate("roundrobin", num_ranks=2, num_microbatches=4, layer_costs=unit, memory_limit=2.0, weight_limit=1)


def _job_layers(schedule) -> list[int]:
    """Layers per job, read from the meta as the layout's docstring lays the jobs out: forward groups first
    layers first, the fused last group, then the backward groups last layers first."""
    meta = schedule.meta
    return [*meta["forward_layers"], *meta["last_layers"], *reversed(meta["backward_layers"])]


def _replay_prefetch(row) -> list[tuple[tuple[int, ...], int]]:
    """Per action of one device's row, (the jobs whose weights are held, how many of them are open),
    replayed from the pool's rule as written (pool_worker._prefetch), not from roundrobin_layout: the jobs
    whose first action on the device is at or before this one and whose last is at or after it are open
    (in the order they started); while fewer than two are, the job whose first action comes next is held
    too."""
    spans = {}
    for position, action in enumerate(row):
        start, _ = spans.get(action.stage, (position, position))
        spans[action.stage] = (start, position)
    replayed = []
    for position in range(len(row)):
        open_jobs = [j for j, (start, end) in spans.items() if start <= position <= end]
        coming = sorted((start, j) for j, (start, _) in spans.items() if start > position)
        held = open_jobs + ([coming[0][1]] if coming and len(open_jobs) < 2 else [])
        replayed.append((tuple(held), len(open_jobs)))
    return replayed


def test_held_weights_allow_ending_a_later_started_job_first_and_refuse_three_jobs():
    """The generator may now emit a device that runs its part of the split fused group between its next
    job's early recompute and that job's end (the pool and the load-stream simulator free weights in
    end order); moving a third job's start inside that window would need three jobs' weights."""
    layer_costs = Costs([1.0] * 8, [1.0] * 8, [1.0] * 8, 0.1)
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=4, layer_costs=layer_costs)
    validate(schedule)
    row = schedule.actions[0]
    starts = list(dict.fromkeys(a.stage for a in row))
    last = {a.stage: p for p, a in enumerate(row)}
    assert any(last[a] > last[b] for a, b in zip(starts, starts[1:], strict=False)), schedule.render()
    replayed = [_replay_prefetch(row) for row in schedule.actions]
    assert [held_jobs(row) for row in schedule.actions] == [[held for held, _ in r] for r in replayed]
    size = _job_layers(schedule)
    layers = tuple(max(sum(size[j] for j in held) for held, _ in r) for r in replayed)
    assert peak_weight_layers(schedule) == layers
    assert held_weights(schedule) == (max(count for r in replayed for _, count in r), max(layers)) == (2, max(layers))
    assert steady_state(schedule, job_costs(layer_costs, pool_groups(schedule)), load_stream=True).period > 0
    inner = next(b for a, b in zip(starts, starts[1:], strict=False) if last[a] > last[b])
    later = starts[starts.index(inner) + 1]
    moved = next(a for a in row if a.stage == later)
    at = next(p for p, a in enumerate(row) if a.stage == inner)
    rest = [a for a in row if a is not moved]
    three = schedule.replace(actions=(tuple(rest[:at] + [moved] + rest[at:]), *schedule.actions[1:]))
    assert held_weights(three)[0] == 3


def test_the_drain_split_deals_the_last_backward_jobs_over_more_devices():
    """("tail", k, count): the k backward jobs that run last, each interleaved over ``count`` devices, each
    of those devices uploading the job's weights; combined with a split fused group in one spec."""
    m = 8
    layer_costs = profile(16, 1.5, 2.1)
    groups = PoolGroups((4, 4, 4, 4), 1, (1,) * 16)
    schedule, costs, _ = dispatched(groups, layer_costs, num_devices=8, num_microbatches=m, ahead=1,
                                    split_job=(("last", "interleaved", 2), ("tail", 3, 4)))
    validate(schedule)
    split = _split_jobs(schedule)
    tail = range(groups.num_stages - 3, groups.num_stages)
    assert set(split) == {groups.last_stage, *tail}
    # parts are dealt like jobs, to the first free device: a device may run two parts of one job
    assert len(split[groups.last_stage]) == 2 and all(2 <= len(split[j]) <= 4 for j in tail)
    loads = sum(a.kind.value == "LOAD" for _, _, a in schedule.all_actions())
    assert loads == groups.num_stages + sum(len(where) - 1 for where in split.values())
    assert simulate(schedule, costs).makespan >= sum(
        s.end - s.start for s in simulate(schedule, costs).spans) / 8 - 1e-9


def test_the_drain_split_shortens_a_drain_paced_step():
    # 32 one-layer backward jobs on 8 devices: the last ones end a micro-batch apart, one after another
    m = 16
    layer_costs = profile(32, 1.5, 2.1)
    groups = PoolGroups((4,) * 8, 1, (1,) * 32)
    spans = {spec: simulate(*dispatched(groups, layer_costs, num_devices=8, num_microbatches=m, ahead=1,
                                        split_job=spec)[:2]).makespan
             for spec in (None, ("tail", 8, 2), ("tail", 8, 4))}
    assert min(spans[("tail", 8, 2)], spans[("tail", 8, 4)]) < spans[None] - 1e-9, spans


def test_grown_fused_tries_every_size_one_layer_apart_within_the_weight_cap():
    layer_costs = profile(64, 1.5, 2.1)
    groups = PoolGroups((4,) * 16, 1, (1,) * 64)
    sizes = {cut.last for cut, _ in roundrobin_search.grown_fused(groups, layer_costs, 8, 8, weight_cap=6)}
    assert sizes == {2, 3, 4, 5}  # the shares (12.5% of 65 layers = 8, ...) are all above the cap
    wide = {cut.last for cut, _ in roundrobin_search.grown_fused(groups, layer_costs, 8, 8)}
    assert min(wide) == 8 and not sizes & wide


def test_least_peak_is_below_every_orders_peak_and_reached_one_ahead():
    layer_costs = profile(12, 2.0, 2.6)
    for groups in (PoolGroups((4, 4, 4), 1, (1,) * 12), PoolGroups((5, 5), 3, (2, 3, 5)), PoolGroups((9,), 4, (9,))):
        least = roundrobin_search.least_peak(groups, 4)
        peaks = [max(peak_memory(s)) for look in (1, 2) for split in (False, True)
                 for s, _, _ in [dispatched(groups, layer_costs, num_devices=4, num_microbatches=6, ahead=look,
                                            weight_transfers=False, split_backward=split)]]
        assert min(peaks) >= least - 1e-9 and abs(peaks[0] - least) < 1e-9, (groups, least, peaks)
