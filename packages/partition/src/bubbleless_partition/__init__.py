"""bubbleless_partition: cut a model's layers into pipeline stages that balance time and fit memory.

    >>> from bubbleless_partition import LayerCost, Profile, cut
    >>> layers = [LayerCost(name=str(i), forward=1, input_grad=1, weight_grad=1) for i in range(8)]
    >>> heavy = LayerCost(name="head", forward=4, input_grad=4, weight_grad=4)
    >>> cut(Profile(layers=(*layers, heavy)), num_stages=3, method="dp").sizes
    (4, 4, 1)

Pure Python; ``profile()`` imports torch only when called (``pip install bubbleless-partition[profile]``).
"""

from .analytic import TransformerShape, analytic_profile
from .cut import METHODS, cut
from .hardware import (
    A800,
    H200,
    HARDWARE,
    MI300X,
    RTX_4090,
    Hardware,
    hardware,
    hardware_from_dict,
    hardware_to_dict,
    load_hardware,
    save_hardware,
)
from .layers import LayerCost, Profile
from .measure import profile
from .partition import Partition, price_pipeline, price_roundrobin
from .shapes import SHAPES, shape
from .store import load_profile, profile_from_dict, profile_to_dict, save_profile

__version__ = "0.1.0"
__all__ = [
    "A800", "H200", "HARDWARE", "METHODS", "MI300X", "RTX_4090", "SHAPES",
    "Hardware", "LayerCost", "Partition", "Profile", "TransformerShape",
    "analytic_profile", "cut", "hardware", "hardware_from_dict", "hardware_to_dict", "load_hardware",
    "load_profile", "price_pipeline", "price_roundrobin", "profile", "profile_from_dict", "profile_to_dict",
    "save_hardware", "save_profile", "shape",
]
