"""bubbleless_offload: not implemented yet (see the package README)."""

__version__ = "0.0.0"
__all__: list[str] = []
