"""bubbleless_offload: host-resident training state streamed to stateless device workers.

The pieces the round-robin (RoundPipe-style) executor is built from: ``HostStore`` (working weights,
fp32 masters and gradient accumulators in host memory), ``DeviceWeights`` (a job's layers uploaded to
a device and their gradients stored back), ``GradientAdds`` (the host adds of stored gradients, on a
thread), ``WeightUploads`` (weight copies cut into chunks and paced behind activation uploads),
``DeviceStreams`` and events, ``MemoryBudget``, activation transfers
(``to_host``/``to_device``), ``PinnedPool``, and the CPU ``HostOptimizer`` with its
``DynamicLossScaler`` (``AsyncHostOptimizer``: the same step run one iteration stale on a thread).
Importing it touches no device and creates no tensor.
"""

from .activations import to_device, to_host
from .device_weights import DeviceWeights, LoadedJob
from .grad_adds import GradientAdds
from .host_optimizer import OPTIMIZERS, HostOptimizer, HostStepResult
from .host_optimizer_async import AsyncHostOptimizer
from .host_store import HostParam, HostStore
from .host_view import HostView
from .loss_scaler import DynamicLossScaler
from .memory_budget import DeviceOutOfMemory, MemoryBudget, format_bytes
from .mmap_safetensors import mmap_safetensors
from .pinned_pool import PinnedPool
from .streams import CpuEvent, CpuStream, DeviceStreams, stream_context
from .weight_uploads import Upload, WeightUploads

__version__ = "0.1.0"
__all__ = [
    "OPTIMIZERS", "AsyncHostOptimizer", "CpuEvent", "CpuStream", "DeviceOutOfMemory", "DeviceStreams", "DeviceWeights",
    "DynamicLossScaler", "GradientAdds", "HostOptimizer", "HostParam", "HostStepResult", "HostStore", "HostView", "LoadedJob",
    "MemoryBudget", "PinnedPool", "Upload", "WeightUploads", "format_bytes", "mmap_safetensors", "stream_context",
    "to_device", "to_host",
]
