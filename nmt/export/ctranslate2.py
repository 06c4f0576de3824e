"""A Transformer checkpoint as a CTranslate2 model directory, through CTranslate2's own converter API.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is a C++ inference engine. Its Python package
describes a model as a spec (`ctranslate2.specs.TransformerSpec`) whose variables a converter fills
from the original weights; `Converter.convert` then validates the spec, optionally quantizes it and
writes `model.bin`, `config.json` and the vocabularies. The mapping from our Transformer:

    ours                                        CTranslate2 spec
    Embedding: tokens * sqrt(H) + PE(pos)       embeddings.weight, scale_embeddings=True, position_encodings.encodings
    PE: sin/cos interleaved (pe[:, 0::2] = sin) a table of max_positions rows (CTranslate2's built-in
                                                sinusoids put all sines first, so the table is given)
    self-attention q/k/v/out projections        self_attention.linear[0] = [q; k; v] fused, linear[1] = out
    cross-attention q, k/v, out                 attention.linear[0] = q, linear[1] = [k; v], linear[2] = out
    scale 1/sqrt(D), or 1 (model.scale=false)   queries_scale
    Residual(...).norm before/after             layer_norm of each sub-layer, pre_norm = (model.norm == "pre")
    final_norm (pre-norm only)                  encoder/decoder layer_norm
    decoder.output (tied or not)                decoder.projection
    LayerNorm eps 1e-5                          config.layer_norm_epsilon
    source ids + EOS                            config.add_source_eos=True; decoding starts from <s>

The SentencePiece model goes beside it (sentencepiece.model, or source.model and target.model for
separate vocabularies). RNN models have no CTranslate2 counterpart and are refused.

Shape legend: V vocab, H model dim, P max_positions.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from nmt.config import Config
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.export import export_target, staged
from nmt.models.seq2seq import Seq2Seq
from nmt.models.transformer import MultiHeadAttention, Residual, sinusoidal_positions


def _ct2():
    try:
        import ctranslate2
    except ImportError:
        raise NmtError(
            "format=ctranslate2 needs the ctranslate2 package: pip install -e '.[ct2]' in the nmt clone "
            "(or pip install ctranslate2)"
        ) from None
    return ctranslate2


def _array(tensor: torch.Tensor):
    return tensor.detach().float().cpu().numpy()


def _linear(spec, *linears: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or several of ours, stacked along the outputs (fused projections)."""
    spec.weight = _array(torch.cat([linear.weight for linear in linears]))
    if linears[0].bias is not None:
        spec.bias = _array(torch.cat([linear.bias for linear in linears]))


def _norm(spec, residual: Residual) -> None:
    spec.gamma, spec.beta = _array(residual.norm.weight), _array(residual.norm.bias)


def _attention(spec, attn: MultiHeadAttention, residual: Residual, self_attention: bool) -> None:
    if self_attention:
        _linear(spec.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
    else:
        _linear(spec.linear[0], attn.q_proj)
        _linear(spec.linear[1], attn.k_proj, attn.v_proj)
    _linear(spec.linear[-1], attn.out_proj)
    spec.queries_scale = torch.tensor(attn.scale, dtype=torch.float32).numpy()
    _norm(spec.layer_norm, residual)


def _ffn(spec, ffn: torch.nn.Sequential, residual: Residual) -> None:
    _linear(spec.linear_0, ffn[0])
    _linear(spec.linear_1, ffn[3])
    _norm(spec.layer_norm, residual)


def _stack(spec, stack: torch.nn.Module, max_positions: int) -> None:
    """Embeddings, positions, layers and final norm shared by the encoder and decoder specs."""
    embed = stack.embed
    (spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings).weight = _array(embed.tokens.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(sinusoidal_positions(max_positions, embed.dim))  # (P, H)
    if isinstance(stack.final_norm, torch.nn.LayerNorm):
        spec.layer_norm.gamma, spec.layer_norm.beta = _array(stack.final_norm.weight), _array(stack.final_norm.bias)


def transformer_spec(model: Seq2Seq, cfg: Config, max_positions: int):
    """The ctranslate2.specs.TransformerSpec holding a Transformer's weights."""
    specs = _ct2().specs
    pre = cfg.model.norm == "pre"
    encoder = specs.TransformerEncoderSpec(cfg.model.layers, cfg.model.heads, pre_norm=pre)
    decoder = specs.TransformerDecoderSpec(cfg.model.layers, cfg.model.heads, pre_norm=pre)
    _stack(encoder, model.encoder, max_positions)
    for spec, layer in zip(encoder.layer, model.encoder.layers):
        _attention(spec.self_attention, layer.attn, layer.res_attn, self_attention=True)
        _ffn(spec.ffn, layer.ffn, layer.res_ffn)
    _stack(decoder, model.decoder, max_positions)
    decoder.projection.weight = _array(model.decoder.output.weight)  # (V, H)
    for spec, layer in zip(decoder.layer, model.decoder.layers):
        _attention(spec.self_attention, layer.self_attn, layer.res_self, self_attention=True)
        _attention(spec.attention, layer.cross_attn, layer.res_cross, self_attention=False)
        _ffn(spec.ffn, layer.ffn, layer.res_ffn)
    spec = specs.TransformerSpec(encoder, decoder)
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = model.encoder.layers[0].res_attn.norm.eps
    return spec


def _pieces(processor) -> list[str]:
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def ct2_search_options(decode) -> dict:
    """CTranslate2 `translate_batch` options that search as nmt's decode settings do, where one exists.

    Both beam searches keep the same hypotheses; they differ only in how finished ones are ranked. CTranslate2
    divides a score by length ** length_penalty, nmt by GNMT's ((5 + length) / 6) ** alpha: only alpha = 0 (no
    normalisation) has an equal, length_penalty = 0 (tested: beam 5, identical outputs). For alpha > 0 no
    length_penalty ranks alike; ask CTranslate2 for the n-best with length_penalty = 0 and rank them by GNMT's
    penalty instead (`rerank`), which agrees with nmt on most sentences but is not the same search (nmt ranks
    every hypothesis that finished, possibly more than the beam)."""
    options = {
        "beam_size": decode.beam,
        "max_decoding_length": None,  # set per batch: decode.max_len_a * source length + decode.max_len_b
        "min_decoding_length": decode.min_len,
        "suppress_sequences": [["<pad>"], ["<s>"]],  # nmt never emits PAD or BOS
    }
    options["length_penalty"] = 0.0 if decode.alpha == 0 else None
    return options


def rerank(hypotheses: list[list[str]], scores: list[float], alpha: float) -> int:
    """The index of the hypothesis nmt's GNMT penalty ranks first among CTranslate2's n-best (scores summed
    log-probabilities, length_penalty = 0); a hypothesis' length counts its EOS step."""
    return max(range(len(hypotheses)), key=lambda i: scores[i] / ((5 + len(hypotheses[i]) + 1) / 6) ** alpha)


def decode_record(decode) -> dict:
    """The training run's decode settings and their CTranslate2 equivalent, for nmt_export.json."""
    from dataclasses import asdict

    options = ct2_search_options(decode)
    equal = options["length_penalty"] is not None
    return {
        "nmt": asdict(decode),
        "ctranslate2": {k: v for k, v in options.items() if v is not None} if equal else None,
        "note": (
            "translate_batch with these options searches and ranks as nmt does (max_decoding_length per batch: "
            f"{decode.max_len_a} * source length + {decode.max_len_b})"
            if equal
            else f"alpha={decode.alpha}: CTranslate2 has no GNMT length penalty; use length_penalty=0 with "
            "num_hypotheses=beam and rank by ((5 + length) / 6) ** alpha (nmt.export.ctranslate2.rerank)"
        ),
    }


def export_ctranslate2(
    model: Seq2Seq,
    cfg: Config,
    tokenizer: Tokenizer,
    out: str,
    quantization: str | None,
    max_positions: int,
    source: str,
    shortlist: str | None = None,
) -> Path:
    """Write the CTranslate2 model directory `out` (it must not exist, or be empty); returns its path. `shortlist`:
    a vocabulary map (nmt-shortlist), checked against the tokenizer and written as the model's vmap.txt."""
    if cfg.model.arch != "transformer":
        raise NmtError(
            f"checkpoint={source}: a model.arch={cfg.model.arch} model; CTranslate2 runs Transformers only, so "
            "format=ctranslate2 cannot export it"
        )
    target = export_target(out)
    if shortlist:
        from nmt.shortlist import Shortlist

        Shortlist.read(shortlist, tokenizer, key="shortlist")  # a bad line is named before anything is written
    ctranslate2 = _ct2()

    class NmtConverter(ctranslate2.converters.Converter):
        def _load(self):
            spec = transformer_spec(model, cfg, max_positions)
            spec.register_source_vocabulary(_pieces(tokenizer.src))
            spec.register_target_vocabulary(_pieces(tokenizer.tgt))
            return spec

    with staged(target, out) as tmp:
        NmtConverter().convert(str(tmp), quantization=quantization)
        for name, data in (
            {"sentencepiece.model": tokenizer.src_model}
            if tokenizer.joint
            else {"source.model": tokenizer.src_model, "target.model": tokenizer.tgt_model}
        ).items():
            (tmp / name).write_bytes(data)
        if shortlist:
            shutil.copyfile(shortlist, tmp / "vmap.txt")  # CTranslate2 reads it there (translate_batch use_vmap=True)
        notes = {
            "from": source,
            "arch": "transformer",
            "max_positions": max_positions,
            "quantization": quantization or "float32",
            "source": "SentencePiece pieces; </s> is appended by CTranslate2 (add_source_eos)",
            "decoder_start": "<s>",
            "decode": decode_record(cfg.decode),
            **({"vmap": f"vmap.txt, from {shortlist}: translate_batch(..., use_vmap=True)"} if shortlist else {}),
        }
        (tmp / "nmt_export.json").write_text(json.dumps(notes, indent=1) + "\n", encoding="utf-8")
    return target
