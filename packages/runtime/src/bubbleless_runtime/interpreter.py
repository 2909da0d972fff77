"""The interpreter core both executors share: walk one worker's actions, call the handler of each kind.

A back end (the multi-process ranks of ``executor.py``, the device pool of ``pool.py``) supplies a
table from action kind to handler; the core knows nothing else about it. One contract for every
handler::

    handler(backend, action, state) -> Iterable[work] | None

A handler does its action and returns the work it started but did not finish (transfers to post), or
nothing. Kinds listed in ``batched`` only start work: what they return goes into an outbox that the
core hands to ``backend.post`` in one batch just before the next unbatched action runs (and at the
end), so consecutive sends and receives are posted together. Every unbatched action gets a span
``(action, start, end)`` in ``state.spans``: it starts where the previous one ended (the batched
handlers' posting is work of this worker) plus the seconds the handler reported in ``state.blocked``
(time spent waiting for another worker), so the gaps of a measured timeline are exactly the waits the
simulator models.

A new action kind is one handler per back end: add it to that back end's table (``Interpreter.with_handler``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bubbleless_schedules import Action, Kind

Handler = Callable[[object, Action, object], Iterable | None]


@dataclass(frozen=True)
class Interpreter:
    """A handler table, which kinds only post work, and the back end's name for error messages."""

    name: str
    """The back end, as errors name it (``"the multi-process executor"``)."""
    handlers: Mapping[Kind, Handler]
    """Action kind -> handler; a kind missing here cannot run on this back end."""
    batched: frozenset[Kind] = field(default_factory=frozenset)
    """Kinds whose returned work is posted together before the next action of another kind."""

    def with_handler(self, kind: Kind, handler: Handler, *, batched: bool = False) -> Interpreter:
        """A copy that also runs ``kind`` with ``handler`` (or replaces the handler it had)."""
        kinds = set(self.batched) - {kind} | ({kind} if batched else set())
        return Interpreter(self.name, {**self.handlers, kind: handler}, frozenset(kinds))

    def check(self, actions: Sequence[Action]) -> None:
        """ValueError naming the first action this back end has no handler for."""
        for position, action in enumerate(actions):
            if action.kind not in self.handlers:
                raise ValueError(
                    f"{self.name} cannot run {action} (position {position}): it has no handler for "
                    f"{action.kind} actions; it runs {', '.join(k.value for k in self.handlers)}"
                )

    def run(self, backend, actions: Iterable[Action], state) -> None:
        """Run ``actions`` in order; ``state`` needs ``spans`` (a list) and ``blocked`` (float seconds)."""
        handlers, batched = self.handlers, self.batched
        outbox: list = []
        resumed = time.time()
        for action in actions:
            handler = handlers[action.kind]
            if action.kind in batched:
                outbox.extend(handler(backend, action, state) or ())
                continue
            if outbox:
                backend.post(outbox)
                outbox = []
            state.blocked = 0.0
            leftover = handler(backend, action, state)
            if leftover:
                backend.post(list(leftover))
            end = time.time()
            state.spans.append((action, min(resumed + state.blocked, end), end))
            resumed = end
        if outbox:
            backend.post(outbox)
