"""Checkpoints keep the random generators: Python's, torch's CPU one and, where CUDA is available, every
CUDA device's; a resume that cannot restore the CUDA states warns and goes on (``checkpoint_rng``)."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from bubbleless_runtime import checkpoint
from bubbleless_runtime._testing.trainers import TinyBatches, tiny_trainer
from bubbleless_runtime.checkpoint_rng import cuda_rng_problem
from bubbleless_runtime.trainer import Trainer

CUDA = torch.cuda.is_available()


def make_trainer(seed: int = 0) -> Trainer:
    trainer = tiny_trainer(seed)
    trainer.train_step(TinyBatches())
    return trainer


def draws() -> list[float]:
    """The next numbers each generator gives (every CUDA device's where there are any)."""
    got = [random.random(), float(torch.rand(()))]
    for device in range(torch.cuda.device_count() if CUDA else 0):
        got.append(float(torch.rand((), device=f"cuda:{device}")))
    return got


def load_quietly(trainer: Trainer, directory) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here fails the test
        trainer.load(directory)


def test_rt_checkpoint_rng_round_trips_through_the_files_and_the_next_draws_repeat(tmp_path):
    trainer = make_trainer()
    cpu, python = torch.get_rng_state(), random.getstate()
    path = trainer.save(tmp_path / "checkpoint-1")
    want = draws()
    rng = checkpoint.load(path)["rng"]
    assert set(rng) == ({"torch", "python", "cuda"} if CUDA else {"torch", "python"})
    assert torch.equal(rng["torch"], cpu) and rng["python"] == python
    random.seed(99)
    torch.manual_seed(99)
    load_quietly(make_trainer(seed=4), path)
    assert draws() == want


def test_rt_a_checkpoint_without_cuda_rng_state_loads_and_warns_only_where_cuda_is(tmp_path):
    trainer = make_trainer()
    state = trainer.state_dict()
    state["rng"].pop("cuda", None)  # as written without CUDA, or by an older bubbleless-runtime
    path = checkpoint.save(state, tmp_path / "checkpoint-1", trainer.group)
    want = draws()[:2]
    resumed = make_trainer(seed=4)
    if CUDA:
        with pytest.warns(RuntimeWarning, match="holds no CUDA RNG state.*will not repeat"):
            resumed.load(path)
    else:
        load_quietly(resumed, path)
    assert draws()[:2] == want and resumed.step == trainer.step


@pytest.mark.skipif(CUDA, reason="resumes a GPU machine's checkpoint where CUDA is not available")
def test_rt_cuda_rng_states_resumed_without_cuda_warn_and_the_rest_loads(tmp_path):
    trainer = make_trainer()
    state = trainer.state_dict()
    state["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]  # two GPUs'
    path = checkpoint.save(state, tmp_path / "checkpoint-1", trainer.group)
    assert len(checkpoint.load(path)["rng"]["cuda"]) == 2  # the format keeps them
    want = draws()
    resumed = make_trainer(seed=4)
    with pytest.warns(RuntimeWarning, match="CUDA RNG states of 2 devices but CUDA is not available here"):
        resumed.load(path)
    assert draws() == want and resumed.step == trainer.step


def test_rt_cuda_rng_states_are_restored_only_with_the_device_count_they_were_saved_with():
    state = torch.zeros(16, dtype=torch.uint8)
    assert cuda_rng_problem([state, state], cuda_available=True, device_count=2) is None
    assert cuda_rng_problem(None, cuda_available=False, device_count=0) is None
    problem = cuda_rng_problem([state, state], cuda_available=True, device_count=4)
    assert "states of 2 devices but 4 are visible" in problem and "resume with 2 visible devices" in problem
    assert "devices [1] are not byte tensors" in cuda_rng_problem([state, state.float()], cuda_available=True,
                                                                   device_count=2)
    assert "holds no CUDA RNG state" in cuda_rng_problem(None, cuda_available=True, device_count=1)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: saves and restores torch.cuda.get_rng_state_all()")
def test_rt_cuda_rng_states_of_every_device_are_saved_and_restored(tmp_path):
    trainer = make_trainer()
    path = trainer.save(tmp_path / "checkpoint-1")
    saved = checkpoint.load(path)["rng"]["cuda"]
    assert len(saved) == torch.cuda.device_count()
    want = [torch.rand(8, device=f"cuda:{d}").cpu() for d in range(torch.cuda.device_count())]
    load_quietly(make_trainer(seed=4), path)
    got = [torch.rand(8, device=f"cuda:{d}").cpu() for d in range(torch.cuda.device_count())]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
