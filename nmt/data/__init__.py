"""Corpus reading and validation, SentencePiece, encoded-dataset cache, batching, synthetic tasks."""
