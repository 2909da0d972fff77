"""No hangs, no orphans: stalled ranks, a killed or interrupted launcher, and the error that names the cause."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from bubbleless_runtime import PipelineCommError, spawn
from bubbleless_runtime._testing import procs
from bubbleless_runtime._testing.faults import first_step_waits, raise_mid_step, start_a_grandchild_then_fail
from bubbleless_runtime.launch import RankFailure


def wait_until(predicate, limit: float = 30.0) -> bool:
    """Poll ``predicate`` until true or ``limit`` seconds (a bound against hanging, not a speed check)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def python(script: str, marker: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, procs.MARKER: marker, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.mark.slow
def test_rt_a_stalled_rank_ends_spawn_naming_it_and_the_interpreter_exits():
    """SIGSTOP one rank: the survivors time out, spawn raises RankFailure naming the stopped rank, the
    stopped process is killed and the interpreter exits (it used to hang joining the stopped child)."""
    marker = uuid.uuid4().hex
    proc = python("""
        from bubbleless_runtime import spawn
        from bubbleless_runtime._testing.faults import stall_after_one_step
        try:
            spawn(stall_after_one_step, 3, 1, 3.0, threads_per_process=1, grace=2.0)
        except Exception as exc:
            print(type(exc).__name__, exc, flush=True)
        """, marker)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert out.startswith("RankFailure rank 1 stopped responding"), out + err[-3000:]
    assert "stopped (SIGSTOP" in out and "rank 0 (PipelineCommError" in out, out
    assert wait_until(lambda: not procs.marked(marker)), procs.marked(marker)


@pytest.mark.slow
def test_rt_a_rank_raising_mid_step_is_the_headline_every_time():
    """The last stage's loss_fn returns a non-scalar; its ValueError, not a survivor's PipelineCommError,
    is what spawn raises, in each of five runs (reports arrive in any order)."""
    for _ in range(5):
        with pytest.raises(ValueError, match="loss_fn must return a scalar") as info:
            spawn(raise_mid_step, 3, 30.0, threads_per_process=1)
        assert "raised in rank 2 of 3" in "".join(info.value.__notes__)


@pytest.mark.slow
def test_rt_the_first_step_gets_its_own_timeout():
    """A rank 2.5 s late to its first step: fine under first_step_timeout=30 with timeout=1, a
    PipelineCommError with the first step held to timeout=1."""
    assert spawn(first_step_waits, 2, 1.0, 30.0, 2.5, threads_per_process=1) == ["ok", "ok"]
    with pytest.raises(PipelineCommError, match="timeout=1s"):
        spawn(first_step_waits, 2, 1.0, 1.0, 2.5, threads_per_process=1)


@pytest.mark.slow
def test_rt_processes_a_rank_started_are_killed_with_it(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(KeyError, match="fails on purpose"):
        spawn(start_a_grandchild_then_fail, 2, str(pid_file), threads_per_process=1)
    pid = int(pid_file.read_text())
    assert wait_until(lambda: not procs.alive(pid)), f"grandchild {pid} outlived its rank"


LAUNCHER = """
    import sys
    from bubbleless_runtime import spawn
    from bubbleless_runtime._testing.faults import sleep_forever
    try:
        spawn(sleep_forever, 2, sys.argv[1], threads_per_process=1, stop_grace=5.0)
    except BaseException as exc:
        print(type(exc).__name__, exc, flush=True)
        raise SystemExit(getattr(exc, "exit_code", 1))
    """


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_rt_killing_the_launcher_takes_its_ranks_down(tmp_path, signum):
    marker = uuid.uuid4().hex
    env = {**os.environ, procs.MARKER: marker, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LAUNCHER), str(tmp_path)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_files = [tmp_path / f"rank{r}.pid" for r in range(2)]
    assert wait_until(lambda: all(p.exists() and p.read_text() for p in pid_files), 120), proc.stderr.read()
    ranks = [int(p.read_text()) for p in pid_files]
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert wait_until(lambda: not any(procs.alive(pid) for pid in ranks)), "a rank outlived its launcher"
    assert wait_until(lambda: not procs.marked(marker)), procs.marked(marker)
    if signum != signal.SIGKILL:
        assert proc.returncode == 128 + signum, out + err[-3000:]
        assert out.startswith(f"RunInterrupted stopped by {signal.Signals(signum).name}"), out + err[-3000:]


def test_rt_rank_failures_rank_own_errors_over_deaths_over_stalls_over_comm_errors():
    from bubbleless_runtime.rank_failures import died, raise_root_cause, reported, stalled

    comm = reported(0, PipelineCommError("receiving 1F0 from pipeline rank 1 failed"), "tb")
    dead = died(3, -9)
    assert dead.text == "rank 3 was killed by SIGKILL without reporting a result"
    with pytest.raises(RankFailure, match=r"^rank 3 was killed by SIGKILL .* \(of 4 ranks\); then rank 0 "
                                          r"\(PipelineCommError: receiving 1F0"):
        raise_root_cause([comm, stalled(2, None), dead], 4)
    with pytest.raises(RankFailure, match="^rank 2 stopped responding"):
        raise_root_cause([comm, stalled(2, None)], 4)
    with pytest.raises(ZeroDivisionError):
        raise_root_cause([comm, dead, reported(1, ZeroDivisionError("x"), "tb")], 4)
    # a blocking collective (a checkpoint's barrier) fails with a plain RuntimeError: still a consequence
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
                        "waiting 3000ms for recv operation to complete")
    with pytest.raises(RankFailure, match="^rank 2 stopped responding"):
        raise_root_cause([reported(0, gloo, "tb"), stalled(2, None)], 4)


@pytest.mark.slow
def test_rt_bubbleless_train_with_a_stopped_rank_ends_non_zero_naming_it(tmp_path):
    """SIGSTOP one rank of `bubbleless train` mid-run: the run ends with exit code 1 and the headline
    names the stopped rank, and no process of it is left (it used to hang after the survivors raised)."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 4,\n"
        "        num_kv_heads: 2, head_dim: 8}\ndata: {task: copy, num_symbols: 8, length: 4, batch_size: 8}\n"
        "pipeline: {schedule: 1f1b, nproc: 3, num_microbatches: 4, timeout: 3}\ntrain: {steps: 2000}\n"
    )
    marker = uuid.uuid4().hex
    out = tmp_path / "out"
    proc = python(f"""
        from bubbleless_runtime.cli import main
        raise SystemExit(main(["train", {str(config)!r}, "--output-dir", {str(out)!r}]))
        """, marker)
    assert wait_until(lambda: (out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines())
                      >= 3, 240), proc.stderr.read() if proc.poll() is not None else "no steps"
    ranks = procs.ranks_of(proc.pid)
    assert len(ranks) == 3, ranks
    os.kill(ranks[1], signal.SIGSTOP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    headline = err.strip().splitlines()[-1]
    assert re.match(r"bubbleless: rank \d stopped responding: .*stopped \(SIGSTOP", headline), err[-3000:]
    assert wait_until(lambda: not procs.marked(marker)), procs.marked(marker)


@pytest.mark.slow
def test_rt_the_process_group_timeout_can_be_shortened_after_the_first_step():
    """bubbleless train starts its group with first_step_timeout and shortens it to pipeline.timeout after
    the first step (torch's _set_pg_timeout): on gloo a blocking all-reduce must then give up in time."""
    from bubbleless_runtime._testing.faults import collective_after_shortening_the_timeout

    results = spawn(collective_after_shortening_the_timeout, 2, 1.0, 4.0, threads_per_process=1, pg_timeout=60)
    assert results[0].startswith("failed: ") and "Timed out" in results[0], results


def test_rt_stop_votes_summed_over_ranks_agree_on_the_signal_a_max_would():
    """Votes summed as the loss all-reduce sums them: no vote -> None, any rank's signal -> it, and ranks
    with different signals agree on the highest-numbered one (SIGTERM 15 over SIGINT 2), as MAX did."""
    from bubbleless_runtime.signals import StopRequest, agreed_signal

    def rank(signum):
        stop = StopRequest()
        stop.signum = signum
        return stop.votes()

    def summed(*signums):
        return [sum(column) for column in zip(*(rank(s) for s in signums), strict=True)]

    assert agreed_signal(summed(None, None, None)) is None
    assert agreed_signal(summed(None, signal.SIGINT, None)) == signal.SIGINT
    assert agreed_signal(summed(signal.SIGINT, signal.SIGTERM, signal.SIGINT)) == signal.SIGTERM
    assert agreed_signal(summed(signal.SIGTERM, signal.SIGTERM)) == signal.SIGTERM
