"""Encoder-decoder models behind one interface (see seq2seq.py)."""
