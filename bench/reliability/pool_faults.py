"""The round-robin pool's faults (issue 9, section 4): a worker raising, out of memory, a budget too small.

Each case runs ``RoundRobinPipeline`` on 4 CPU devices in this process: a step that meets the fault
(in a thread, so a hang would show as a timeout rather than stop the bench), then a step that does not.
"""

from __future__ import annotations

import copy
import random
import threading

import torch
from torch import nn

from bubbleless_offload import DeviceOutOfMemory
from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model
from bubbleless_runtime.pool import RoundRobinPipeline
from bubbleless_schedules.roundrobin_layout import PoolGroups

CPU4 = ["cpu"] * 4
HANG = 60.0
CALLS = {"count": 0, "fail_at": 0}


class FailOn(nn.Module):
    """The identity, except that the ``CALLS["fail_at"]``-th call of any copy of it raises."""

    def forward(self, activation):
        CALLS["count"] += 1
        if CALLS["count"] == CALLS["fail_at"]:
            raise RuntimeError("layer exploded on purpose")
        return activation


def _in_thread(fn):
    """(returned value or None, exception or None, hung)."""
    box: dict = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - recorded
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(HANG)
    return box.get("value"), box.get("error"), thread.is_alive()


def _pool_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("bubbleless-pool-"))


def _matches_unpipelined(model, ref, inputs, targets) -> bool:
    _, want = reference_grads(ref, inputs, targets, 4)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return set(got) == set(want) and max(relative_error(got[n], want[n]) for n in want) <= 1e-5


def worker_raises(rng: random.Random) -> dict:
    model = tiny_model(6)
    model.insert(3, FailOn())
    ref = copy.deepcopy(model)
    inputs, targets = tiny_batch(8)
    pipe = RoundRobinPipeline(model, devices=CPU4, num_microbatches=4, loss_fn=tiny_loss,
                              partition=PoolGroups((2, 3), 2, (2, 2, 1)), timeout=60)
    CALLS.update(count=0, fail_at=rng.randrange(1, 9))  # a forward, recompute or fused call of step 1
    _, error, hung = _in_thread(lambda: pipe.step(inputs, targets))
    clear = isinstance(error, RuntimeError) and "exploded on purpose" in str(error) and any(
        "round-robin pool running" in n for n in getattr(error, "__notes__", []))
    CALLS.update(count=0, fail_at=0)
    for p in model.parameters():
        p.grad = None
    _, again, hung_again = _in_thread(lambda: pipe.step(inputs, targets))
    recovered = again is None and not hung_again and _matches_unpipelined(model, ref, inputs, targets)
    return dict(hung=hung or hung_again, clear=clear, recovered=recovered, threads=_pool_threads(),
                message=_short(error))


def out_of_memory(rng: random.Random) -> dict:
    model = tiny_model(7, width=64)
    pipe = RoundRobinPipeline(model, devices=CPU4, num_microbatches=4, loss_fn=tiny_loss,
                              partition=PoolGroups((3, 2), 2, (1, 2, 2)), memory_budget=200_000, timeout=60)
    big = tiny_batch(4 * rng.randrange(150, 250), width=64)  # the weights fit, these activations do not
    _, error, hung = _in_thread(lambda: pipe.step(*big))
    notes = " ".join(getattr(error, "__notes__", []))
    clear = isinstance(error, DeviceOutOfMemory) and "more micro-batches" in notes
    ref = copy.deepcopy(model)
    for p in model.parameters():
        p.grad = None
    small = tiny_batch(8, width=64)
    _, again, hung_again = _in_thread(lambda: pipe.step(*small))
    recovered = again is None and not hung_again and _matches_unpipelined(model, ref, *small)
    return dict(hung=hung or hung_again, clear=clear, recovered=recovered, threads=_pool_threads(),
                message=_short(error))


def budget_too_small(rng: random.Random) -> dict:
    model = tiny_model(7, width=64)
    groups = PoolGroups((3, 2), 2, (1, 2, 2))

    def build(budget):
        return RoundRobinPipeline(model, devices=CPU4, num_microbatches=4, loss_fn=tiny_loss, partition=groups,
                                  memory_budget=budget, timeout=60)

    _, error, hung = _in_thread(lambda: build(rng.randrange(5_000, 30_000)))
    clear = isinstance(error, ValueError) and "does not fit memory_budget" in str(error) \
        and "Raise memory_budget" in str(error)
    pipe, again, hung_again = _in_thread(lambda: build(None))
    ref = copy.deepcopy(model)
    inputs, targets = tiny_batch(8, width=64)
    recovered = pipe is not None and _in_thread(lambda: pipe.step(inputs, targets))[1] is None \
        and _matches_unpipelined(model, ref, inputs, targets)
    return dict(hung=hung or hung_again, clear=clear, recovered=recovered, threads=_pool_threads(),
                message=_short(error))


def _short(error) -> str:
    if error is None:
        return "(none raised)"
    text = str(error).splitlines()[0][:110].replace("|", "/")
    return f"`{type(error).__name__}: {text}`"


CASES = {"worker raises mid-step": worker_raises, "out of memory (budget, at run time)": out_of_memory,
         "budget too small (refused before running)": budget_too_small}


def run_all(runs: int, rng: random.Random) -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    for case, fn in CASES.items():
        results = [fn(rng) for _ in range(runs)]
        rows.append(dict(case=case, runs=runs, hangs=sum(r["hung"] for r in results),
                         clear=sum(r["clear"] for r in results), recovered=sum(r["recovered"] for r in results),
                         threads_left=max(r["threads"] for r in results), message=results[0]["message"]))
        print(case, rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    for row in run_all(1, random.Random(0)):
        print(row)
