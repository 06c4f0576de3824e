"""Checkpoint converters for inference engines (nmt-export)."""
