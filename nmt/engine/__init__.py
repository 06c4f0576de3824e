"""The decoding engine: it turns a trained model (nmt.models) into a decoding copy, and owns its fast step.

    copy = decoding_copy(model, "int8")      # the trained model is left as it is

A decoding copy computes what the model computes, faster, in one of PRECISIONS:
    transformer.py  the Transformer's copy: fused projections, prescaled queries, padded cross-attention keys,
                    the whole encoder and the whole decoder step in one native call each where the kernels take
                    them, else the model's own step on the converted modules (the one fast step)
    quantize.py     the linear layers in bf16 or int8 (`convert_linears`); fp32 on MKL's packed product
                    (packed.py), oneDNN's or nmt's own kernel (onednn.py)
    layers.py       a copy's layers as the native kernels take them (structs of pointers)
    native.py       the C kernels, built on first use, and their ctypes wrappers
    shortlist.py    a copy cut to a batch's candidate tokens (a vocabulary shortlist)
Search (nmt.search) runs a copy like the model, through the decoder interface of nmt.models.seq2seq; the API
(nmt.api) loads every model it decodes through `decoding_copy`. The modules import one way: native <- packed <-
onednn <- quantize <- layers <- transformer <- this; nmt.models never imports the engine, and tests hold the
copies' outputs to the models' (tests/test_engine.py).
"""

from __future__ import annotations

import copy as copying

from torch import nn

from nmt.engine import transformer
from nmt.engine.quantize import PRECISIONS, convert_linears
from nmt.models import transformer as model_transformer

__all__ = ["PRECISIONS", "decoding_copy"]

COPIES = {  # a trained module's type -> the engine's copy of it (parts of other models are used as they are)
    model_transformer.TransformerEncoder: transformer.TransformerEncoder.of,
    model_transformer.TransformerDecoder: transformer.TransformerDecoder.of,
}


def decoding_copy(model: nn.Module, precision: str = "fp32") -> nn.Module:
    """A decoding copy of a trained encoder-decoder (nmt.models.seq2seq.Seq2Seq), in eval mode: its encoder and
    decoder replaced by the engine's (`COPIES`), then every linear layer outside the attention scorers by its
    `precision` version (fp32, bf16 or int8: nmt.engine.quantize). The trained model is not changed."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision}: expected one of {', '.join(PRECISIONS)}")
    copy = copying.deepcopy(model).eval()
    for name in ("encoder", "decoder"):
        part = getattr(copy, name, None)
        if type(part) in COPIES:
            setattr(copy, name, COPIES[type(part)](part))
    convert_linears(copy, precision)
    return copy.eval()
