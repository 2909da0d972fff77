"""Rank functions for the fault tests (``spawn`` needs them importable): ranks that stall, raise
mid-step, or start processes of their own. Test helpers only; nothing here is used by training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch
import torch.distributed as dist

from . import tiny_batch, tiny_loss, tiny_model


def _pipe(timeout: float, loss_fn=tiny_loss, **options):
    from ..pipeline import Pipeline

    torch.set_num_threads(1)
    num_ranks = dist.get_world_size()
    model = tiny_model(num_ranks + 1)
    return Pipeline(model, schedule="1f1b", num_microbatches=2 * num_ranks, loss_fn=loss_fn, timeout=timeout,
                    **options)


def stall_after_one_step(rank: int, victim: int, timeout: float) -> None:
    """One good step, then ``victim`` stops itself (SIGSTOP) and the others step into the silence."""
    pipe = _pipe(timeout)
    inputs, targets = tiny_batch(4 * dist.get_world_size())
    pipe.step(inputs, targets)
    dist.barrier()
    if rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    pipe.step(inputs, targets)


def vector_loss(output, target):
    """A loss_fn returning one value per sample, not a scalar (a user error that shows mid-step)."""
    hidden, _, _ = output
    return ((hidden - target) ** 2).mean(dim=-1)


def raise_mid_step(rank: int, timeout: float) -> None:
    """The last stage's ``loss_fn`` returns a non-scalar on the first step: that rank raises ValueError."""
    pipe = _pipe(timeout, loss_fn=vector_loss)
    pipe.step(*tiny_batch(4 * dist.get_world_size()))


def start_a_grandchild_then_fail(rank: int, pid_file: str) -> None:
    """Rank 0 starts a long sleeping child process (its pid in ``pid_file``), then every rank raises."""
    if rank == 0:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(pid_file, "w") as f:
            f.write(str(child.pid))
    dist.barrier()
    raise KeyError(f"rank {rank} fails on purpose")


def sleep_forever(rank: int, pid_dir: str) -> None:
    """Write this rank's pid under ``pid_dir`` and sleep (the launcher is killed by the test)."""
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    signal.pause()


def first_step_waits(rank: int, timeout: float, first_step_timeout: float, delay: float) -> str:
    """Rank 1 sleeps ``delay`` s before its first step (a slow compilation); with ``first_step_timeout``
    above ``delay`` the step must go through although ``delay`` exceeds ``timeout``."""
    import time

    pipe = _pipe(timeout, first_step_timeout=first_step_timeout)
    inputs, targets = tiny_batch(4 * dist.get_world_size())
    if rank == 1:
        time.sleep(delay)
    pipe.step(inputs, targets)
    return "ok"


def collective_after_shortening_the_timeout(rank: int, seconds: float, delay: float) -> str:
    """Shorten the default group's timeout to ``seconds`` (as ``bubbleless train`` does after its first
    step), then all-reduce with rank 1 ``delay`` s late: rank 0 must give up after ``seconds``."""
    import time
    from datetime import timedelta

    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=seconds))
    if rank == 1:
        time.sleep(delay)
    try:
        dist.all_reduce(torch.zeros(1))
    except RuntimeError as exc:
        return f"failed: {str(exc)[:200]}"
    return "ok"
