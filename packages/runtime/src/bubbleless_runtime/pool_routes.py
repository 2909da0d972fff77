"""Where each action of a round-robin schedule reads its tensors from, derived from the layout alone.

The round-robin layout (``bubbleless_schedules.roundrobin_layout``) says what every action requires and
produces; this module turns those events into reads, once per schedule:

- an F or R of job ``j`` needs the activation entering layer ``layers(j).start``: the step's input
  for layer 0, else the payload of the ``("F", k, m)`` event it requires, at that layer;
- a forward job therefore saves (to host) the activation entering every layer inside it where a
  backward group or the last group starts, and its output: the payload of its F event is
  ``{layer: activation}``;
- a B, or the I of a split backward, needs the gradient in the ``("G", j', m)`` event it requires (none
  for the last group, whose gradient starts at the loss); the W after an I reads nothing from the board
  (its device kept what it needs, ``pool_split``).

Nothing here asks "which device ran the producer": a payload is read the same way from the board
whether the producer ran on this device or another one.
"""

from __future__ import annotations

from dataclasses import dataclass

from bubbleless_schedules import Action, Kind, Schedule
from bubbleless_schedules.layouts import layout_of
from bubbleless_schedules.roundrobin_layout import PoolGroups, pool_groups


@dataclass(frozen=True)
class Routes:
    """Per action: the board events to wait for, where the input comes from, and what to save."""

    groups: PoolGroups
    waits: dict[Action, tuple]
    """Events an action waits for (the layout's ``requires``, minus events its own device made earlier
    in its order: those are in the worker's own state)."""
    input_event: dict[Action, tuple | None]
    """F and R: the F event whose payload holds the input (None: the step's micro-batch input)."""
    grad_event: dict[Action, tuple | None]
    """B and I: the G event holding the gradient of the job's output (None for the last group)."""
    saves: dict[int, tuple[int, ...]]
    """Forward job -> layers whose entering activation it saves to host (its output's layer last)."""
    needs_input_grad: dict[int, bool]
    """Gradient job -> whether a later job reads the gradient of its input."""
    readers: dict[tuple, int]
    """Board event -> how many actions read its payload (it is dropped after the last)."""
    produces: dict[Action, tuple]
    """The events an action posts when it ends (the layout's ``produces``); its payload goes with the first."""
    split_backward: frozenset[tuple[int, int]]
    """(job, micro-batch) whose backward runs as I then W: its forward (R, or the last group's F) defers
    the weight gradients of its linear layers (``pool_split``)."""


def routes_of(schedule: Schedule) -> Routes:
    groups = pool_groups(schedule)
    layout = layout_of(schedule)
    starts = {groups.layers(j).start for j in range(groups.last_stage, groups.num_stages)} - {0}
    saves = {}
    for j in range(groups.last_stage):
        layers = groups.layers(j)
        saves[j] = tuple(b for b in sorted(starts | {layers.stop}) if layers.start < b <= layers.stop)
    waits, input_event, grad_event, readers, produces, split_backward = {}, {}, {}, {}, {}, set()
    needs_input_grad = {j: False for j in range(groups.last_stage, groups.num_stages)}
    for worker in schedule.actions:
        for action in worker:
            required = layout.requires(action, schedule)
            produces[action] = layout.produces(action, schedule)
            waits[action] = tuple(e for e in required if e[0] != "R")  # R is made by the same device, just before
            if action.kind in (Kind.F, Kind.R):
                forward = [e for e in required if e[0] == "F"]
                input_event[action] = forward[0] if forward else None
                if forward:
                    readers[forward[0]] = readers.get(forward[0], 0) + 1
            if action.kind is Kind.I:
                split_backward.add((action.stage, action.microbatch))
            if action.kind in (Kind.B, Kind.I):
                gradient = [e for e in required if e[0] == "G"]
                grad_event[action] = gradient[0] if gradient else None
                if gradient:
                    needs_input_grad[gradient[0][1]] = True
                    readers[gradient[0]] = readers.get(gradient[0], 0) + 1
    return Routes(groups, waits, input_event, grad_event, saves, needs_input_grad, readers, produces,
                  frozenset(split_backward))
