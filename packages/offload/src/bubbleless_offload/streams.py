"""Per-device streams and events: ``DeviceStreams``, ``stream_context``, and CPU stand-ins for both.

Each device gets four streams, as RoundPipe uses them: weights in, activations in, compute, and one
for everything going out (gradients, activations to the host). Work on different streams overlaps;
an event recorded on one stream and waited on by another orders them without blocking the thread.

On a ``cuda`` device (CUDA and ROCm builds both expose ``torch.cuda``) these are real
``torch.cuda.Stream``/``torch.cuda.Event`` objects. On ``cpu`` every copy is synchronous, so a
``CpuStream`` orders nothing and a ``CpuEvent`` is complete the moment it exists; the calling code is
the same on both, which is what lets the round-robin executor be tested on machines without a GPU.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["CpuEvent", "CpuStream", "DeviceStreams", "stream_context"]


class CpuEvent:
    """An event on a CPU stream: the work before it is already done (CPU copies are synchronous)."""

    def wait(self, stream=None) -> None:
        """Make ``stream`` wait for this event: nothing to wait for on CPU."""

    def synchronize(self) -> None:
        """Block until the event completes: it has."""

    def query(self) -> bool:
        """True: the event has completed."""
        return True


class CpuStream:
    """Stand-in for a device stream on a CPU "device"; ``name`` only helps reading traces and errors."""

    def __init__(self, name: str) -> None:
        self.name = name

    def record_event(self) -> CpuEvent:
        return CpuEvent()

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"CpuStream({self.name!r})"


def stream_context(stream):
    """Context in which queued device work goes to ``stream`` (``torch.cuda.stream``); nothing on CPU."""
    if stream is None or isinstance(stream, CpuStream):
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


def current_stream(device: torch.device):
    """The stream work goes to right now on ``device`` (a ``CpuStream`` on CPU)."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device)
    return CpuStream("current")


def record_blocking(stream):
    """An event at the end of the work queued on ``stream`` so far. On a GPU its ``synchronize`` sleeps
    rather than spins (``blocking=True``), leaving the core to the host optimizer and the other devices'
    threads while a worker waits for a copy; on CPU a ``CpuEvent``."""
    if isinstance(stream, CpuStream):
        return stream.record_event()
    event = torch.cuda.Event(blocking=True)
    event.record(stream)
    return event


def mark_used_on(tensor: torch.Tensor, stream) -> None:
    """Tell the caching allocator ``tensor`` is used on ``stream`` too, so its memory is not reused early.

    A tensor allocated on one stream and read on another could otherwise be freed and handed out again
    while the other stream still reads it. CPU tensors need nothing.
    """
    if tensor.device.type == "cuda" and not isinstance(stream, CpuStream):
        tensor.record_stream(stream)


class DeviceStreams:
    """The four streams of one device: ``weights_in``, ``activations_in``, ``compute``, ``out``.

    Build one per device when the worker starts (creating CUDA streams initialises CUDA, so never at
    import). ``device``: ``"cpu"``, ``"cuda"`` (the current CUDA device) or ``"cuda:N"``.
    """

    KINDS = ("weights_in", "activations_in", "compute", "out")

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"DeviceStreams({str(device)!r}): no CUDA/ROCm device is available here; use 'cpu'")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            make = lambda kind: torch.cuda.Stream(device=device)  # noqa: E731
        elif device.type == "cpu":
            make = CpuStream
        else:
            raise ValueError(f"DeviceStreams: device type {device.type!r} is not supported; use 'cpu' or 'cuda:N'")
        self.device = device
        self.weights_in = make("weights_in")
        self.activations_in = make("activations_in")
        self.compute = make("compute")
        self.out = make("out")

    @property
    def is_cpu(self) -> bool:
        """True for a CPU "device", whose streams and events are stand-ins."""
        return self.device.type == "cpu"

    def record(self, stream):
        """An event marking the work queued on ``stream`` so far.

        It has ``.wait(other_stream)``, ``.synchronize()`` (sleeping, on a GPU) and ``.query()`` on every device."""
        return record_blocking(stream)

    def current(self):
        """The stream the calling thread queues work on now (the default stream unless inside ``stream_context``)."""
        return current_stream(self.device)

    def __repr__(self) -> str:
        return f"DeviceStreams({str(self.device)!r})"
