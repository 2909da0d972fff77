"""What a decoder layer's backward spends putting gradients back into its fused projections' layout on this
CPU: the rate a measured ``cpu`` profile prices those copies at (``common.small_op_profile``, in I).

    python -m bench.modelled.layout_ops      # measures, writes the ``layout_backward`` entry of cpu_ops.yaml

Why: ``bench.measured.tiny.DecoderLayer`` splits one fused q/k/v projection by ``view``, ``permute`` and
unpacking (an ``unbind``) and one fused gate/up projection by ``chunk``; their backward writes the three
attention gradients and the two MLP gradients into one tensor each (``stack`` and ``cat``: torch.profiler
on one layer's forward and backward shows two ``aten::cat`` a layer), passes over memory that neither the
GEMM, attention nor elementwise rates time.

How: exactly those forward ops on leaves of the fused projections' output shapes, and
``torch.autograd.grad`` through them from contiguous gradients (as attention's and the gating multiply's
backward hand them), by the timing thread's CPU time over copies past ``cpu_ops.COLD_BYTES``, median of
many sweeps; the rate is ``layout_bytes_per_token`` (read and write of both fused gradients) over the time.
The few autograd nodes it runs (view, permute, unbind, chunk) are also among ``OTHER_OPS_PER_LAYER``'s
dispatch: about 25 us of a 0.36 ms layer (2026-12-02), counted twice.

``python bench/model.py --measure-cpu`` keeps this entry as it is (``cpu_ops.MEASURED_APART``).
"""

from __future__ import annotations

from dataclasses import dataclass


def layout_bytes_per_token(hidden: int, intermediate: int, dtype_bytes: int) -> float:
    """Bytes the layout backward reads and writes per token: the q/k/v gradients (``3 hidden``) and the
    gate/up gradients (``2 intermediate``), each read once and written once into the fused tensor."""
    return dtype_bytes * 2 * (3 * hidden + 2 * intermediate)


@dataclass(frozen=True, kw_only=True)
class LayoutBackward:
    """The layout backward's rate, measured (this module's docstring)."""

    gb_s: float
    """``layout_bytes_per_token`` over its time, GB/s."""
    source: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.gb_s, (int, float)) and self.gb_s > 0):
            raise ValueError(f"LayoutBackward.gb_s must be positive, got {self.gb_s!r}")


def measure_layout_backward(*, tokens: int = 256, hidden: int = 256, intermediate: int = 768, heads: int = 4,
                            repeats: int = 15, cold_bytes: int | None = None) -> LayoutBackward:
    """Time the layout backward on the calling thread (set torch's threads first)."""
    import torch

    from .cpu_ops import COLD_BYTES, _figures, _thread_seconds

    cold = COLD_BYTES if cold_bytes is None else cold_bytes

    def make():
        qkv = torch.randn(1, tokens, 3 * hidden, requires_grad=True)
        gate_up = torch.randn(1, tokens, 2 * intermediate, requires_grad=True)
        q, k, v = qkv.view(1, tokens, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
        gate, up = gate_up.chunk(2, dim=-1)
        outs = (q, k, v, gate, up)
        grads = [torch.randn_like(o) for o in outs]
        call = lambda: torch.autograd.grad(outs, (qkv, gate_up), grads, retain_graph=True)  # noqa: E731
        return call, 4 * 4 * tokens * (3 * hidden + 2 * intermediate)

    seconds = _thread_seconds(make, repeats, cold)
    return LayoutBackward(
        gb_s=_figures(tokens * layout_bytes_per_token(hidden, intermediate, 4) / seconds / 1e9),
        source=f"thread CPU time, median of {repeats} sweeps over copies past {cold >> 20} MiB, fp32, "
               f"{torch.get_num_threads()} thread(s), {tokens} tokens, hidden {hidden}, MLP {intermediate}, {heads} "
               f"heads: autograd backward of the q/k/v view-permute-unbind and the gate/up chunk of "
               f"bench.measured.tiny.DecoderLayer, against the read and write of both fused gradients")


def layout_backward_to_dict(layout: LayoutBackward) -> dict:
    return {"value": layout.gb_s, "source": layout.source}


def layout_backward_from_dict(data: dict) -> LayoutBackward:
    try:
        return LayoutBackward(gb_s=float(data["value"]), source=data["source"])
    except (KeyError, TypeError) as error:
        raise ValueError(f"a layout_backward entry needs {{value: GB/s, source}}: {error}") from error


def main() -> None:
    from .ops_entry import write_ops_entry

    write_ops_entry("layout_backward", lambda: layout_backward_to_dict(measure_layout_backward()))


if __name__ == "__main__":
    main()
