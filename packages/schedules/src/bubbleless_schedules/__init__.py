"""bubbleless_schedules: every pipeline schedule as data, validated, simulated and drawn.

    >>> from bubbleless_schedules import generate, simulate
    >>> timeline = simulate(generate("1f1b", num_ranks=4, num_microbatches=8))
    >>> round(timeline.bubble_rate, 4)   # (p-1)/(m+p-1)
    0.2727
"""

from .action import Action, Kind
from .costs import Costs
from .layouts import register_layout
from .lowering import add_communication, add_weight_transfers, fuse_backward
from .placement import loop_placement, v_placement
from .plot import plot_timeline
from .registry import aliases, available, canonical_name, generate, register
from .roundrobin_layout import PoolGroups, held_jobs, peak_weight_layers, pool_groups
from .schedule import Schedule
from .simulate import Span, Timeline, peak_memory, simulate
from .timeline_text import render_timeline
from .trace import trace_events, write_trace
from .validate import validate

__version__ = "0.1.0"


def job_costs(layer_costs: Costs, groups: PoolGroups) -> Costs:
    """A round-robin schedule's per-job costs from per-layer ones (each field one value per layer, the head
    last): each job's layers summed, forward jobs without backward or store; ``simulate`` takes these.
    (Imported on call: the generators load on first use, never at package import.)"""
    from .generators.roundrobin_cut import job_costs as summed

    return summed(layer_costs, groups)
__all__ = [
    "Action", "Costs", "Kind", "PoolGroups", "Schedule", "Span", "Timeline",
    "add_communication", "add_weight_transfers", "aliases", "available", "canonical_name", "fuse_backward",
    "generate", "held_jobs", "job_costs", "loop_placement", "peak_memory", "peak_weight_layers", "plot_timeline", "pool_groups",
    "register", "register_layout", "render_timeline", "simulate", "trace_events", "v_placement", "validate",
    "write_trace",
]
