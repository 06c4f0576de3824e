"""The model zoo's names and the combinations it can build, checked without building anything (no torch).

nmt.config runs these at composition (ModelConfig.__post_init__), so a typo or an impossible combination fails
before any data is read; the builders (seq2seq.py, rnn.py, attention.py) look the same names up in their dicts,
and tests/test_config_checks.py checks that both lists agree.
"""

from __future__ import annotations

from typing import Any

from nmt.errors import NmtError

ARCHS = ("bahdanau", "luong", "transformer")  # nmt.models.builders.BUILDERS
CELLS = ("gru", "lstm")  # nmt.models.rnn.CELLS
BRIDGES = ("bridge", "zero")
SCORES = ("additive", "dot", "general", "concat", "location")  # nmt.models.attention.SCORES
WINDOWS = ("global", "local_m", "local_p")
KINDS = ("soft", "hard")


def check_attention(score: str, window: str, kind: str) -> None:
    """Fail on an unknown name, listing the valid ones, or on a combination that does not exist."""
    for key, value, valid in (("score", score, SCORES), ("window", window, WINDOWS), ("attention", kind, KINDS)):
        if value not in valid:
            raise NmtError(f"model.{key}={value}: unknown; expected one of {', '.join(valid)}")
    if score == "location" and window != "global":
        raise NmtError(
            f"model.score=location with model.window={window}: location attention is global only "
            "(it scores absolute positions); use another score or window=global"
        )


def check_rnn_names(cell: str, bridge: str, score: str, window: str, attention: str) -> None:
    """Fail on a cell, bridge, score, window or attention kind that is not one of the choices, listing them."""
    if cell not in CELLS:
        raise NmtError(f"model.cell={cell}: unknown; expected one of {', '.join(CELLS)}")
    if bridge not in BRIDGES:
        raise NmtError(f"model.bridge={bridge}: unknown; expected one of {', '.join(BRIDGES)}")
    check_attention(score, window, attention)


def check_rnn(
    decoder: str,
    cell: str,
    bridge: str,
    score: str,
    window: str,
    attention: str,
    dim: int,
    embed_dim: int,
    bidirectional: bool,
    tie_output: bool,
) -> None:
    """Fail on a name that is not one of the choices (listing them) or on sizes that cannot fit together."""
    check_rnn_names(cell, bridge, score, window, attention)
    if bidirectional and dim % 2:
        raise NmtError(f"model.dim={dim}: a bidirectional encoder needs an even dim (dim / 2 per direction)")
    if decoder == "luong" and tie_output and embed_dim != dim:
        raise NmtError(
            f"model.tie_embeddings=true with arch=luong needs model.embed_dim == model.dim (got {embed_dim} and {dim})"
        )


def check_model_config(cfg: Any) -> None:
    """Names and sizes the builder could not use (cfg: nmt.config.ModelConfig), caught at composition.

    Every name is checked whichever arch reads it, so a typo never passes because this arch ignores the key.
    """
    if cfg.arch not in ARCHS:
        raise NmtError(f"model.arch={cfg.arch}: unknown; expected one of {', '.join(sorted(ARCHS))}")
    check_rnn_names(cfg.cell, cfg.bridge, cfg.score, cfg.window, cfg.attention)
    if cfg.arch == "transformer" and cfg.dim % cfg.heads:
        raise NmtError(
            f"model.dim={cfg.dim} with model.heads={cfg.heads}: the model dim must be a multiple of the number of heads"
        )
    if cfg.arch in ("bahdanau", "luong"):
        embed_dim = cfg.dim if cfg.embed_dim is None else cfg.embed_dim
        check_rnn(
            cfg.arch,
            cfg.cell,
            cfg.bridge,
            cfg.score,
            cfg.window,
            cfg.attention,
            cfg.dim,
            embed_dim,
            cfg.bidirectional,
            cfg.tie_embeddings,
        )
