"""The random number generators in a checkpoint: Python's, torch's CPU generator and every CUDA device's.

A checkpoint's ``rng`` is ``{"torch": <CPU generator state>, "python": random.getstate(), "cuda": [...]}``,
``cuda`` holding ``torch.cuda.get_rng_state_all()`` (one byte tensor per visible device, in device
order) and present only where CUDA was available when it was written. The conventions are the Hugging
Face Trainer's (``_save_rng_state``/``_load_rng_state``): device states are saved where the device is
there, and a resume that cannot put them back warns and goes on rather than failing. Such a run is still
correct; only its random operations on the GPU (dropout) no longer repeat the uninterrupted run's.

The CUDA states are restored when the checkpoint has them, CUDA is available and the device count is
the one they were saved with (a state per device: with another count, which device's generator is which
is unknown). Every other case is a ``RuntimeWarning`` saying what was not restored and why
(``cuda_rng_problem``, a pure function, decides), except a checkpoint without CUDA states resumed
without CUDA, which has nothing to restore.
"""

from __future__ import annotations

import random
import warnings

import torch

__all__ = ["capture_rng", "cuda_rng_problem", "restore_rng"]

_NOT_REPEATED = "random operations on the GPU (dropout) will not repeat those of the uninterrupted run"


def capture_rng() -> dict:
    """This process's generator states, as a checkpoint's ``rng`` keeps them."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def cuda_rng_problem(saved: list | None, *, cuda_available: bool, device_count: int) -> str | None:
    """Why the saved CUDA states (None: the checkpoint has none) cannot be restored here, or None if they
    can be (or there is nothing to restore)."""
    if saved is None:
        if not cuda_available:
            return None
        return (f"the checkpoint holds no CUDA RNG state (it was written where CUDA was not available, or by an "
                f"older bubbleless-runtime): the {device_count} CUDA device generators keep their current state, so "
                f"{_NOT_REPEATED}")
    if not cuda_available:
        return (f"the checkpoint holds the CUDA RNG states of {len(saved)} devices but CUDA is not available here: "
                f"they are not restored ({_NOT_REPEATED} if this run later uses CUDA)")
    if len(saved) != device_count:
        return (f"the checkpoint holds the CUDA RNG states of {len(saved)} devices but {device_count} are visible "
                f"here: they are not restored, so {_NOT_REPEATED}; resume with {len(saved)} visible devices "
                "(CUDA_VISIBLE_DEVICES) to restore them")
    bad = [i for i, s in enumerate(saved) if not (isinstance(s, torch.Tensor) and s.dtype == torch.uint8)]
    if bad:
        return (f"the checkpoint's CUDA RNG states of devices {bad} are not byte tensors (the checkpoint was "
                f"changed or not written by bubbleless): none are restored, so {_NOT_REPEATED}")
    return None


def restore_rng(saved: dict) -> None:
    """Put ``capture_rng``'s states back; a ``RuntimeWarning`` for CUDA states that cannot be."""
    torch.set_rng_state(saved["torch"])
    random.setstate(saved["python"])
    cuda = saved.get("cuda")
    available = torch.cuda.is_available()
    problem = cuda_rng_problem(cuda, cuda_available=available,
                               device_count=torch.cuda.device_count() if available else 0)
    if problem is not None:
        warnings.warn(f"resuming: {problem}", RuntimeWarning, stacklevel=2)
    elif cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
