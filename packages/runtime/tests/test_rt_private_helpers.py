"""The project's own test helpers are private: no public ``bubbleless_runtime.testing*`` module (issue 12)."""

import importlib.util

import bubbleless_runtime


def test_test_helpers_are_private():
    for name in ("testing", "testing_ranks", "testing_cross", "testing_faults"):
        assert importlib.util.find_spec(f"bubbleless_runtime.{name}") is None, name
    assert importlib.util.find_spec("bubbleless_runtime._testing.ranks") is not None
    assert not any(n.startswith("testing") or n == "_testing" for n in getattr(bubbleless_runtime, "__all__", ()))
