"""nmt: an end-to-end neural machine translation toolkit (PyTorch).

The Python API (nmt.api), loaded on first use so that `import nmt` stays light:
    nmt.load(path, device="auto", precision="fp32") -> nmt.Model    (.translate, .translate_file)
    nmt.score(hypotheses, references) -> {"bleu": Score, "chrf": ..., "ter": ...}
    nmt.train(overrides=[...]) or nmt.train(config=...) -> TrainResult(run_dir, results)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_API = ("load", "score", "train", "Model", "Result", "Score", "TrainResult")
__all__ = ["__version__", *_API]

if TYPE_CHECKING:
    from nmt.api import Model, Result, Score, TrainResult, load, score, train  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _API:
        from nmt import api

        return getattr(api, name)
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
