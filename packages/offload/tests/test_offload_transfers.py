"""PinnedPool reuse, CPU streams and events, activation copies, the memory budget on its own."""

from __future__ import annotations

import threading

import pytest
import torch

from bubbleless_offload import (
    CpuStream,
    DeviceOutOfMemory,
    DeviceStreams,
    MemoryBudget,
    PinnedPool,
    format_bytes,
    stream_context,
    to_device,
    to_host,
)


def test_pool_reuses_a_released_buffer_of_the_same_byte_size():
    pool = PinnedPool(pin=False)
    first = pool.acquire((4, 8), torch.float32)
    address = first.data_ptr()
    assert pool.bytes_in_use == pool.bytes_reserved == 128
    pool.release(first)
    assert pool.bytes_in_use == 0 and pool.bytes_reserved == 128
    again = pool.acquire((64,), torch.bfloat16)  # same 128 bytes, other shape and dtype
    assert again.data_ptr() == address and again.shape == (64,) and again.dtype == torch.bfloat16
    other = pool.acquire((3,), torch.float32)
    assert other.data_ptr() != address and pool.bytes_in_use == 140
    pool.release(again)
    pool.release(other)
    with pytest.raises(ValueError, match="did not hand out"):
        pool.release(other)
    with pytest.raises(ValueError, match="did not hand out"):
        pool.release(torch.zeros(3))
    pool.clear()
    assert pool.bytes_reserved == 0


class Copying:
    """A device copy's event: incomplete until ``done`` is set."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def test_a_buffer_released_after_copies_is_reused_only_once_they_complete():
    pool = PinnedPool(pin=False)
    first = pool.acquire((16,), torch.float32)
    address = first.data_ptr()
    reading, writing = Copying(), Copying()
    pool.release(first, after=(writing, reading))
    assert pool.bytes_in_use == 0 and pool.bytes_reserved == 64
    pool.clear()  # a buffer a copy still uses is not dropped
    assert pool.bytes_reserved == 64
    second = pool.acquire((16,), torch.float32)
    assert second.data_ptr() != address  # a copy may still read the first
    writing.done = True
    pool.release(second)
    third = pool.acquire((16,), torch.float32)
    assert third.data_ptr() == second.data_ptr()  # the free one, not the pending one
    reading.done = True
    fourth = pool.acquire((4, 4), torch.float32)
    assert fourth.data_ptr() == address and pool.bytes_in_use == 128 and pool.bytes_reserved == 128


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where no accelerator exists")
def test_pinning_without_an_accelerator_says_to_pass_pin_false():
    with pytest.raises(ValueError, match="pass pin=False"):
        PinnedPool(pin=True)


def test_cpu_streams_are_stand_ins_whose_events_are_complete():
    streams = DeviceStreams("cpu")
    assert all(isinstance(getattr(streams, kind), CpuStream) for kind in DeviceStreams.KINDS)
    event = streams.record(streams.weights_in)
    event.wait(streams.compute)
    event.synchronize()
    assert event.query() and streams.is_cpu
    with stream_context(streams.compute):
        pass
    with pytest.raises(ValueError, match="not supported"):
        DeviceStreams("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where no accelerator exists")
def test_cuda_streams_without_a_gpu_say_so():
    with pytest.raises(ValueError, match="no CUDA/ROCm device"):
        DeviceStreams("cuda:0")


def test_activation_copies_are_real_on_cpu_too():
    pool = PinnedPool(pin=False)
    source = torch.randn(3, 4, requires_grad=True) * 2
    host, event = to_host(source, pool=pool)
    assert event.query() and host.data_ptr() != source.data_ptr() and torch.equal(host, source.detach())
    assert not host.requires_grad and pool.bytes_in_use == host.numel() * 4
    back, event = to_device(host, "cpu")
    assert event.query() and back.data_ptr() != host.data_ptr() and torch.equal(back, host)
    pool.release(host)


def test_budget_counts_peak_and_refuses_with_the_numbers():
    budget = MemoryBudget(1000, "cpu")
    budget.reserve(600, "weights of layers (0,)")
    with pytest.raises(DeviceOutOfMemory, match=r"cpu: no room for activations of micro-batch 2: it needs 500 B"):
        budget.reserve(500, "activations of micro-batch 2")
    budget.free(600)
    assert budget.used == 0 and budget.peak == 600
    budget.reset_peak()
    assert budget.peak == 0
    with pytest.raises(ValueError, match="only 0 bytes are reserved"):
        budget.free(1)
    assert isinstance(DeviceOutOfMemory(device="x", what="y", requested=1, used=0, limit=0), RuntimeError)
    assert format_bytes(1536) == "1.50 KiB" and format_bytes(3 * 2**30) == "3.00 GiB"


def test_budget_is_thread_safe():
    budget = MemoryBudget(None, "cpu")

    def churn():
        for _ in range(2000):
            budget.reserve(3, "x")
            budget.free(3)

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.used == 0 and 3 <= budget.peak <= 12
