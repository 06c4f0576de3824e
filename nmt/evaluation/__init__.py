"""Scoring translations (sacrebleu)."""
