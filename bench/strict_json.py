"""JSON that strict parsers read (node, Go, jq): a non-finite float prints as ``null``, not ``Infinity``.

A modelled point that does not fit has an infinite step and peak (``Prediction``); Python's ``json``
writes those as ``Infinity``/``NaN``, which is not JSON. ``dumps`` maps them to ``None`` first and then
passes ``allow_nan=False``, so a value this mapping misses raises instead of printing invalid JSON.
"""

from __future__ import annotations

import json
import math


def finite(value):
    """``value`` with every non-finite float, at any depth of dicts, lists and tuples, replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value, **kwargs) -> str:
    """``json.dumps(finite(value), allow_nan=False, **kwargs)``."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
