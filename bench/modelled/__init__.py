"""Modelled mode of the bench (issue 10, section 3): a cost model per training system, pure functions
``Point -> Prediction`` of tokens/s, step time, peak device memory and the longest sequence.

    from bench.modelled import Point, predict
    from bubbleless_partition import hardware, shape
    predict("zero-infinity", Point(shape=shape("qwen3-1.7b"), hardware=hardware("rtx4090"), gpus=8, seq_len=2048))

Every number these produce is modelled, and says so (``"modelled": true``). ``common`` holds the shared
physics and assumptions, ``ours`` our systems (built on our planners and simulator), ``baselines`` the
others (from their published mechanisms), ``registry`` the names (a measured runner plugs in under the
same name), ``calibrate`` the comparison with measured CPU runs, ``report`` the tables and plots.
"""

from .common import Point, Prediction
from .registry import SYSTEMS, System, predict, register, systems

__all__ = ["SYSTEMS", "Point", "Prediction", "System", "predict", "register", "systems"]
