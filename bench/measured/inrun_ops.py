"""The cpu profile's small-op rates measured again inside a measured run (``--measure-small-ops``): right
before the first round and right after the last, each on its own micro-benchmark (``cpu_ops.measure_small_ops``
at the scenario's sizes and threads), so that the calibration prices the model on rates timed under the load
the run saw, not only on cpu_ops.yaml's, timed at another hour. Measuring, not fitting: no figure of the
measured systems enters a rate. The record keeps both sets and which one priced the table."""

from __future__ import annotations

from .scenario import Scenario

RATES = ("gemm_tflops", "attention_tflops", "elementwise_gb_s", "loss_gb_s", "op_overhead_s")


def measure(scenario: Scenario) -> dict:
    """The small-op rates at ``scenario``'s sizes with its torch threads per rank (restored after), as the
    ops file's dict (``cpu_ops.small_ops_to_dict``)."""
    import torch

    from bench.modelled.cpu_ops import measure_small_ops, small_ops_to_dict

    if scenario.micro_batch != 1:
        raise ValueError(f"--measure-small-ops times the rates at one sequence per micro-batch (as cpu_ops.yaml); "
                         f"scenario {scenario.name!r} has {scenario.micro_batch}: set microbatches = global_batch")
    before = torch.get_num_threads()
    torch.set_num_threads(scenario.threads)
    try:
        m = scenario.model
        return small_ops_to_dict(measure_small_ops(tokens=scenario.seq_len, hidden=m.hidden,
                                                   intermediate=m.intermediate, heads=m.heads, vocab=m.vocab))
    finally:
        torch.set_num_threads(before)


def mean_small_ops(record: dict):
    """The mean of the ``before`` and ``after`` rates of a run's record (each a ``small_ops_to_dict``), as
    ``SmallOps``: what the calibration prices on when the run measured them."""
    from bench.modelled.cpu_ops import small_ops_from_dict

    try:
        sets = [small_ops_from_dict(record[k]) for k in ("before", "after")]
    except (KeyError, TypeError) as error:
        raise ValueError(f"a run's small_ops record needs 'before' and 'after' rate sets: {error}") from error
    first = sets[0]

    def mean(name):
        values = [getattr(s, name) for s in sets]
        if isinstance(values[0], tuple):
            return tuple(sum(v) / len(v) for v in zip(*values, strict=True))
        return sum(values) / len(values)

    return type(first)(**{n: mean(n) for n in RATES},
                       sources={n: f"mean of the run's before and after: {first.sources.get(n, '')}" for n in RATES})


def describe(record: dict) -> str:
    """One sentence: the run's rates before and after, against each other."""
    parts = []
    for name in ("gemm_tflops", "attention_tflops", "elementwise_gb_s", "loss_gb_s"):
        before, after = (record[k][name]["value"] for k in ("before", "after"))
        parts.append(f"{name} {_fmt(before)} before, {_fmt(after)} after")
    return "; ".join(parts)


def _fmt(value) -> str:
    return "/".join(f"{v:.4g}" for v in value) if isinstance(value, list) else f"{value:.4g}"
