"""What ``torch.optim.AdamW``'s step costs on this CPU over the measured model's own parameter tensors: the
rates the pipelines' models price their optimizer with on a measured ``cpu`` profile (``ours.stage_bound``,
``baselines.torch_1f1b``), in place of a GPU's fused on-device step at memory bandwidth.

    python -m bench.modelled.adam_ops      # measures, writes the ``adamw`` entry of cpu_ops.yaml

Why: the measured pipelines (bench/measured/baselines.py ``torch_1f1b``, bench/measured/ours.py
``stage_bound``) step ``torch.optim.AdamW`` with its default implementation over each rank's parameters.
On CPU tensors torch's default is the per-tensor loop (its foreach kernels are for accelerators): a dozen
dispatched ops per tensor, each a pass over it. Priced as 30 bytes per parameter at the copy bandwidth it
was 5.5 ms a rank on the tiny scenario where a rank's step takes 12-15 ms. The profile's
``cpu_adam_params_per_s`` does not fit either: it is timed on one 8 M-parameter tensor, whose passes all
come from memory, where the model's tensors (at most 0.5 M parameters) keep theirs in cache between one
op and the next.

How: one ``AdamW`` (default implementation, the measured systems' settings) per copy of one layer's
parameter tensors (the embedding, a decoder layer, the head of ``bench.measured.tiny`` at the scenario's
sizes), each with a gradient, copies enough to hold ``COLD_BYTES`` of state together, stepped one
after another, by the timing thread's CPU time (as the other small-op rates), median of many sweeps.
Each kind's rate is its parameters over its seconds; a layer is priced at its parameters over its kind's
rate, so at the measured sizes the price is the measured time.

``python bench/model.py --measure-cpu`` keeps this entry as it is (``cpu_ops.MEASURED_APART``).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("embedding", "decoder", "head")
"""The layer kinds of a profile (``analytic_profile``: the embedding first, the head last)."""
STATE_TENSORS = 4
"""Tensors per parameter an AdamW step touches (the weight, its gradient, the two moments)."""
COLD_BYTES = 128 << 20
"""The copies' state together, more than ``cpu_ops.COLD_BYTES``: a tiny rank's step touches 48 MB (3 M
parameters x 16 bytes), one optimizer over all of it, and this machine's L3 (480 MiB, shared) keeps part of
32 MiB of copies; checked on the tiny model's two rank parameter lists, each one AdamW as the measured runs
step them (2026-12-02): measured over priced 1.03-1.14 from copies past 32 MiB, 0.99-1.00 past 128 MiB."""


@dataclass(frozen=True, kw_only=True)
class AdamWRates:
    """``torch.optim.AdamW``'s default step, parameters per second, per layer kind (``KINDS``)."""

    params_per_s: tuple[float, float, float]
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.params_per_s) != len(KINDS) or not all(
                isinstance(v, (int, float)) and v > 0 for v in self.params_per_s):
            raise ValueError(f"AdamWRates.params_per_s needs {len(KINDS)} positive rates ({', '.join(KINDS)}), "
                             f"got {self.params_per_s!r}")

    def layer_seconds(self, layer: int, num_layers: int, params: float) -> float:
        """Seconds of one step over layer ``layer`` (of ``num_layers``) holding ``params`` parameters."""
        kind = 0 if layer == 0 else 2 if layer == num_layers - 1 else 1
        return params / self.params_per_s[kind]


def measure_adamw(*, hidden: int = 256, intermediate: int = 768, heads: int = 4, vocab: int = 2048,
                  repeats: int = 15, cold_bytes: int = COLD_BYTES) -> AdamWRates:
    """Time the step per layer kind on the calling thread (set torch's threads first)."""
    import torch

    from bench.measured.scenario import TinyShape
    from bench.measured.tiny import DecoderLayer, Embedding, Head

    from .cpu_ops import _figures, _thread_seconds

    shape = TinyShape(layers=1, hidden=hidden, heads=heads, intermediate=intermediate, vocab=vocab)
    builders = {"embedding": Embedding, "decoder": DecoderLayer, "head": Head}
    rates, counts = [], []
    for kind in KINDS:
        params = sum(p.numel() for p in builders[kind](shape).parameters())
        seconds = _thread_seconds(lambda k=kind: _adamw_call(torch, builders[k](shape)), repeats, cold_bytes)
        rates.append(_figures(params / seconds))
        counts.append(f"{kind} {sum(1 for _ in builders[kind](shape).parameters())} tensors, {params} parameters")
    return AdamWRates(
        params_per_s=tuple(rates),
        source=f"thread CPU time, median of {repeats} sweeps over copies past "
               f"{cold_bytes >> 20} MiB, fp32, {torch.get_num_threads()} "
               f"thread(s): torch.optim.AdamW (default implementation, lr 1e-3, betas (0.9, 0.999), eps 1e-8, "
               f"weight decay 0) step over one bench.measured.tiny layer's parameters ({'; '.join(counts)}), "
               f"parameters per second for {', '.join(KINDS)}")


def _adamw_call(torch, layer):
    params = list(layer.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    optimizer.step()  # the moments exist from here on, as after a training run's first step
    return optimizer.step, STATE_TENSORS * 4 * sum(p.numel() for p in params)


def adamw_to_dict(rates: AdamWRates) -> dict:
    return {"value": list(rates.params_per_s), "source": rates.source}


def adamw_from_dict(data: dict) -> AdamWRates:
    try:
        return AdamWRates(params_per_s=tuple(float(v) for v in data["value"]), source=data["source"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"an adamw entry needs {{value: [{', '.join(KINDS)} parameters per second], source}}: "
                         f"{error}") from error


def main() -> None:
    from .ops_entry import write_ops_entry

    write_ops_entry("adamw", lambda: adamw_to_dict(measure_adamw()))


if __name__ == "__main__":
    main()
