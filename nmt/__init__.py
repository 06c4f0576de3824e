"""nmt: an end-to-end neural machine translation toolkit (PyTorch)."""

__version__ = "0.1.0"
