"""Thin command-line entry points; the only code that sees Hydra."""
