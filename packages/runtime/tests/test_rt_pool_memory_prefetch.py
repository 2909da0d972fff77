"""The pool's weight prefetch on orders that end a later-started job first (a split backward's W ends a
job late): the room that job leaves takes the next job not yet ended, so every LOAD after a device's
first finds its weights uploaded, never more than two jobs' weights sit on a device, and the gradients
are the unpipelined model's."""

from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_runtime.pool_worker import POOL
from bubbleless_schedules import Costs, Kind, generate

M = 3
LAYER_COSTS = Costs([1.0] * 12 + [3.0], [1.1] * 12 + [3.0], [1.1] * 12 + [3.0], 0.1, load=[0.5] * 13,
                    store=[0.25] * 13)


def _ends_a_later_job_first(row) -> bool:
    stages = [a.stage for a in row]
    starts = {job: stages.index(job) for job in stages}
    ends = {job: len(stages) - 1 - stages[::-1].index(job) for job in stages}
    return any(starts[a] < starts[b] and ends[a] > ends[b] for a in starts for b in starts)


def test_rt_pool_memory_prefetch_fills_the_room_a_later_started_job_leaves():
    schedule = generate("roundrobin", num_ranks=3, num_microbatches=M, layer_costs=LAYER_COSTS, split_backward=True)
    assert any(_ends_a_later_job_first(row) for row in schedule.actions), schedule.render()
    model, ref = tiny_model(13), tiny_model(13)
    pipe = RoundRobinPipeline(model, devices=["cpu"] * 3, num_microbatches=M, loss_fn=tiny_loss, schedule=schedule,
                              timeout=60)
    loads, most_loaded = [], [0, 0, 0]

    def watched(handler):
        def run(worker, action, state):
            if action.kind is Kind.LOAD:
                loads.append((worker.index, action.stage, action.stage in worker.loaded))
            handler(worker, action, state)
            most_loaded[worker.index] = max(most_loaded[worker.index], len(worker.loaded))
        return run

    interpreter = POOL
    for kind, handler in POOL.handlers.items():
        interpreter = interpreter.with_handler(kind, watched(handler))
    pipe.interpreter = interpreter
    inputs, targets = tiny_batch(2 * M)
    loss = pipe.step(inputs, targets)
    first = {device: min(i for i, (d, _, _) in enumerate(loads) if d == device) for device in range(3)}
    late = [(d, job) for i, (d, job, prefetched) in enumerate(loads) if i != first[d] and not prefetched]
    assert not late, f"LOADs that found no prefetched weights (device, job): {late}\n{schedule.render()}"
    assert most_loaded == [2, 2, 2]
    want_loss, want = reference_grads(ref, inputs, targets, M)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    assert max(relative_error(got[n], want[n]) for n in want) <= 1e-5
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
