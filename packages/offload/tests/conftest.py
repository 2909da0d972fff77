"""Make the helpers beside the tests importable under pytest's importlib mode (which adds no paths)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
