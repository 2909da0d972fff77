"""bubbleless_schedules: every pipeline schedule as data, validated, simulated and drawn.

    >>> from bubbleless_schedules import generate, simulate
    >>> timeline = simulate(generate("1f1b", num_ranks=4, num_microbatches=8))
    >>> round(timeline.bubble_rate, 4)   # (p-1)/(m+p-1)
    0.2727
"""

from .action import Action, Kind
from .costs import Costs
from .layouts import register_layout
from .placement import loop_placement, v_placement
from .registry import aliases, available, canonical_name, generate, register
from .schedule import Schedule
from .simulate import Span, Timeline, peak_memory, simulate
from .validate import validate

__version__ = "0.1.0"
__all__ = [
    "Action", "Costs", "Kind", "Schedule", "Span", "Timeline",
    "aliases", "available", "canonical_name", "generate", "loop_placement", "peak_memory",
    "register", "register_layout", "simulate", "v_placement", "validate",
]
