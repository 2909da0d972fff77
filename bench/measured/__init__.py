"""Measured mode of the bench (issue 10, section 2): every system of a scenario trained for real on this
machine (CPU, gloo), from the same initial weights on the same data, in one run.

    python -m bench.measured --scenario bench/scenarios/tiny.yaml [--quick]

``scenario`` reads the YAML, ``tiny`` is the model, data and loss every system trains, ``ours`` and
``baselines`` hold one worker per system (each run in fresh processes through ``launch.spawn``),
``runner`` times them in alternating rounds and bisects the longest sequence, ``report`` writes
bench/results/measured.md and .json.
"""
