"""Write one entry of the cpu profile's ops file (``cpu_ops.ops_path``), measured by its own command.

The entries ``--measure-cpu`` does not measure (``cpu_ops.MEASURED_APART``) are each timed by a module's
``main``; this is the one place that runs that measurement at the measured ranks' thread count and stores
it beside the others (``framework_ops`` times spawned ranks of one thread each, so the count is theirs too).
"""

from __future__ import annotations

from collections.abc import Callable


def write_ops_entry(name: str, measure: Callable[[], dict]) -> dict:
    """Run ``measure`` on one torch thread (what each measured rank runs, bench/scenarios/tiny.yaml's threads),
    store its dict as entry ``name`` of the ops file and return it."""
    import torch
    import yaml

    from .cpu_ops import ops_path
    from .cpu_profile import DEFAULT_PATH

    torch.set_num_threads(1)
    path = ops_path(DEFAULT_PATH)
    data = yaml.safe_load(path.read_text())
    data[name] = measure()
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=110))
    print(f"wrote the {name} entry of {path}: {data[name]['value']}")
    return data[name]
