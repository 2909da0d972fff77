"""The checks of ``RoundRobinPipeline``'s option dicts: ``optimizer`` (the host optimizer it builds) and
``weight_uploads`` (``bubbleless_offload.WeightUploads``' settings), each refused with what to pass."""

from __future__ import annotations

from collections.abc import Mapping

from bubbleless_offload import DeviceStreams, HostOptimizer, HostStore, WeightUploads
from bubbleless_offload.host_optimizer_async import AsyncHostOptimizer

from .config_checks import WEIGHT_UPLOAD_KEYS as WEIGHT_UPLOAD_OPTIONS


def weight_upload_options(options) -> dict:
    """``weight_uploads`` checked: a mapping of ``WeightUploads``' keyword arguments (values checked there)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"weight_uploads must be a dict of {WEIGHT_UPLOAD_OPTIONS}, got {options!r}")
    unknown = sorted(set(options) - set(WEIGHT_UPLOAD_OPTIONS))
    if unknown:
        raise ValueError(f"weight_uploads: unknown option(s) {unknown}; the options are {WEIGHT_UPLOAD_OPTIONS}")
    WeightUploads(DeviceStreams("cpu"), **options)  # checks the values now, before any planning
    return dict(options)


def asks_asynchronous(options) -> bool:
    """Whether ``optimizer`` asks for the one-step-stale optimizer (its settings are checked later, by
    ``host_optimizer``; planning needs only this)."""
    return isinstance(options, Mapping) and options.get("asynchronous") is True


def host_optimizer(store: HostStore, options) -> HostOptimizer | AsyncHostOptimizer | None:
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ValueError(f"optimizer must be None or a dict of HostOptimizer settings such as "
                         f"{{'name': 'adamw', 'lr': 1e-4}}, got {options!r}")
    options = dict(options)
    if "async" in options:
        raise ValueError("optimizer option 'async' is spelled 'asynchronous' here ('async' is a Python keyword): "
                         "pass {'asynchronous': True, ...}")
    asynchronous = options.pop("asynchronous", False)
    if not isinstance(asynchronous, bool):
        raise ValueError(f"optimizer option 'asynchronous' must be True or False, got {asynchronous!r}")
    try:
        return (AsyncHostOptimizer if asynchronous else HostOptimizer)(store, **options)
    except TypeError as error:
        if "keyword argument" not in str(error):
            raise
        raise ValueError(f"optimizer options {sorted(options)}: {error}; the settings are HostOptimizer's "
                         "(name, lr, betas, eps, weight_decay, momentum, max_grad_norm, loss_scaler, fused) "
                         "and 'asynchronous'") from None
