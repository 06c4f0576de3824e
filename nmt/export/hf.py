"""A Transformer checkpoint as a Hugging Face Transformers model directory (`nmt-export format=hf`):
`AutoModelForSeq2SeqLM.from_pretrained(DIR)` and `AutoTokenizer.from_pretrained(DIR)` load it as they are, and
`pipeline("translation", model=DIR)` runs it.

Which architecture: the one whose computation is ours, weight for weight.
    model.norm=post  ->  Marian (MarianMTModel): post-norm layers, no final layer norms, sinusoidal positions
                         kept as a loaded table, embeddings scaled by sqrt(d_model);
    model.norm=pre   ->  Pegasus (PegasusForConditionalGeneration): pre-norm layers with a final layer norm in
                         the encoder and the decoder, and otherwise as Marian. (MBart is pre-norm too but adds a
                         layer norm over the embeddings, which ours lacks; M2M100 computes its sinusoids itself,
                         from position 2 and in another layout, so our positions could not be given to it.)
Both take our position table as their `embed_positions` weights (interleaved sin/cos, from position 0), q/k/v/out
projections with biases, fc1 -> ReLU -> fc2, LayerNorm eps 1e-5, a shared embedding (a joint vocabulary) and the
output layer tied or not. model.scale=false (unscaled dot products) is exported by multiplying the query
projection by sqrt(head dim), which undoes their built-in 1/sqrt(head dim).

The tokenizer is Transformers' MarianTokenizer over our SentencePiece model (source.spm and target.spm, the same
joint model) with vocab.json mapping each piece to our id: it appends </s> to the source as we do. The generation
config starts the decoder from <s> (our BOS), stops at </s>, never emits <pad> or <s> (as our search never does),
and carries the run's beam with length_penalty 0: Transformers' own beam search ranks by score / length **
length_penalty, which ranks as ours (GNMT's ((5 + length) / 6) ** alpha) only at alpha 0. Our search itself goes
with the export as custom_generate/generate.py (nmt/export/hf_generate.py, torch and transformers only), with the
run's decode.alpha, max_len_a, max_len_b and min_len in the generation config (nmt_alpha, ...):
`model.generate(**batch, custom_generate=DIR, trust_remote_code=True)` gives our greedy and beam search's outputs at
any alpha. README.md in the folder says how to call it and when outputs equal ours (nmt/export/hf_card.py).

Refused with one line: RNNs, ensembles, separate source and target vocabularies, learned-position or other
architectures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from nmt.config import Config
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer
from nmt.errors import NmtError
from nmt.export import export_target, staged
from nmt.export.hf_card import EQUAL_OUTPUTS, model_card
from nmt.models.seq2seq import Seq2Seq
from nmt.models.transformer import sinusoidal_positions


def _transformers():
    try:
        import transformers
    except ImportError:
        raise NmtError("format=hf needs the transformers package: pip install -e '.[hf]' in the nmt clone") from None
    return transformers


def _layer_weights(prefix: str, ours: str, layer, kind: str, q_scale: float) -> dict[str, torch.Tensor]:
    """One layer's weights under Transformers' names."""
    out: dict[str, torch.Tensor] = {}

    def attention(theirs: str, mha) -> None:
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear = getattr(mha, name)
            scale = q_scale if name == "q_proj" else 1.0
            out[f"{prefix}.{theirs}.{name}.weight"] = linear.weight.detach() * scale
            out[f"{prefix}.{theirs}.{name}.bias"] = linear.bias.detach() * scale

    def norm(theirs: str, ln) -> None:
        out[f"{prefix}.{theirs}.weight"], out[f"{prefix}.{theirs}.bias"] = ln.weight.detach(), ln.bias.detach()

    if kind == "encoder":
        attention("self_attn", layer.attn)
        norm("self_attn_layer_norm", layer.res_attn.norm)
    else:
        attention("self_attn", layer.self_attn)
        norm("self_attn_layer_norm", layer.res_self.norm)
        attention("encoder_attn", layer.cross_attn)
        norm("encoder_attn_layer_norm", layer.res_cross.norm)
    fc1, fc2 = layer.ffn[0], layer.ffn[3]
    out[f"{prefix}.fc1.weight"], out[f"{prefix}.fc1.bias"] = fc1.weight.detach(), fc1.bias.detach()
    out[f"{prefix}.fc2.weight"], out[f"{prefix}.fc2.bias"] = fc2.weight.detach(), fc2.bias.detach()
    norm("final_layer_norm", layer.res_ffn.norm)
    return out


def permute_hidden(state: dict[str, torch.Tensor], perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same model with its residual stream's dimensions reordered by `perm` (their dim i is our perm[i]):
    weights that read the stream take permuted columns, weights that write it permuted rows, layer norms (which
    are indifferent to the order of dimensions) permuted parameters. Nothing else changes: the model computes the
    same function of its inputs, with position encodings laid out as theirs[:, i] = ours[:, perm[i]]."""
    out = {}
    for name, value in state.items():
        leaf = name.rsplit(".", 2)
        if name.endswith("embed_positions.weight") or name == "final_logits_bias":
            out[name] = value
        elif name in ("model.shared.weight", "lm_head.weight") or name.endswith("embed_tokens.weight"):
            out[name] = value[:, perm]
        elif leaf[-2] in ("q_proj", "k_proj", "v_proj", "fc1"):
            out[name] = value[:, perm] if leaf[-1] == "weight" else value
        elif leaf[-2] in ("out_proj", "fc2"):
            out[name] = value[perm] if leaf[-1] == "bias" else value[perm, :]
        else:  # layer norms
            out[name] = value[perm]
    return out


def export_hf(model: Seq2Seq, cfg: Config, tokenizer: Tokenizer, out: str, max_positions: int, source: str) -> Path:
    """Write the Transformers model directory `out` (it must not exist, or be empty); returns its path."""
    m = cfg.model
    if m.arch != "transformer":
        raise NmtError(
            f"checkpoint={source}: a model.arch={m.arch} model; format=hf exports Transformers (pre-norm as Pegasus, "
            "post-norm as Marian) only"
        )
    if not tokenizer.joint or model.encoder.embed is not model.decoder.embed:
        raise NmtError(
            f"checkpoint={source}: separate source and target vocabularies; format=hf exports models with a joint "
            "vocabulary (data.joint_vocab=true) only"
        )
    target = export_target(out)
    transformers = _transformers()
    decoder = model.decoder
    vocab, dim = decoder.output.out_features, m.dim
    heads = decoder.layers[0].self_attn.heads
    pre = m.norm == "pre"
    common = dict(
        vocab_size=vocab,
        d_model=dim,
        encoder_layers=len(model.encoder.layers),
        decoder_layers=len(decoder.layers),
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=decoder.layers[0].ffn[0].out_features,
        decoder_ffn_dim=decoder.layers[0].ffn[0].out_features,
        activation_function="relu",
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=max_positions,
        scale_embedding=True,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        tie_word_embeddings=decoder.output.weight is decoder.embed.tokens.weight,
        is_encoder_decoder=True,
    )
    if pre:
        config = transformers.PegasusConfig(**common)
        hf_model = transformers.PegasusForConditionalGeneration(config)
    else:
        config = transformers.MarianConfig(**common, decoder_vocab_size=vocab, share_encoder_decoder_embeddings=True)
        hf_model = transformers.MarianMTModel(config)
    q_scale = 1.0 if m.scale else math.sqrt(dim // heads)
    positions = sinusoidal_positions(max_positions, dim)
    tokens = decoder.embed.tokens.weight.detach()
    state = {
        "model.shared.weight": tokens,
        "model.encoder.embed_tokens.weight": tokens,
        "model.decoder.embed_tokens.weight": tokens,
        "model.encoder.embed_positions.weight": positions,
        "model.decoder.embed_positions.weight": positions,
        "lm_head.weight": decoder.output.weight.detach(),
        "final_logits_bias": torch.zeros(1, vocab),
    }
    for i, layer in enumerate(model.encoder.layers):
        state |= _layer_weights(f"model.encoder.layers.{i}", "", layer, "encoder", q_scale)
    for i, layer in enumerate(decoder.layers):
        state |= _layer_weights(f"model.decoder.layers.{i}", "", layer, "decoder", q_scale)
    if pre:
        for side, norm in (("encoder", model.encoder.final_norm), ("decoder", decoder.final_norm)):
            state[f"model.{side}.layer_norm.weight"] = norm.weight.detach()
            state[f"model.{side}.layer_norm.bias"] = norm.bias.detach()
    # Where the model computes its own position table on loading (Marian: the halves layout, sines then cosines), the
    # residual stream is reordered so that ours (interleaved) becomes theirs; where it loads the table, ours is given.
    if any("embed_positions" in key for key in (getattr(hf_model, "_keys_to_ignore_on_save", None) or [])):
        half = torch.arange(0, dim, 2)
        state = permute_hidden(state, torch.cat([half, half + 1]))
    expected = hf_model.state_dict()
    unknown = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unknown or missing:
        raise NmtError(
            f"format=hf: this version of transformers ({transformers.__version__}) names its weights otherwise "
            f"(unknown {unknown[:3]}, missing {missing[:3]}); expected transformers 5"
        )
    with torch.no_grad():
        for name, value in state.items():
            expected[name].copy_(value.to(expected[name].dtype))
    hf_model.eval()
    decode, arch = cfg.decode, "pegasus" if pre else "marian"
    beam = {"num_beams": decode.beam, "length_penalty": 0.0, "early_stopping": True} if decode.beam > 1 else {}
    hf_model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=BOS,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        suppress_tokens=[PAD, BOS],
        max_length=max_positions,
        **beam,
        # read by custom_generate/generate.py only (our search), as the defaults of its alpha, max_len_a, ...
        nmt_alpha=decode.alpha,
        nmt_max_len_a=decode.max_len_a,
        nmt_max_len_b=decode.max_len_b,
        nmt_min_len=decode.min_len,
    )
    with staged(target, out) as tmp:
        tmp.mkdir()
        hf_model.save_pretrained(str(tmp))
        _write_tokenizer(tokenizer, tmp, max_positions)
        (tmp / "custom_generate").mkdir()
        (tmp / "custom_generate" / "generate.py").write_bytes((Path(__file__).parent / "hf_generate.py").read_bytes())
        (tmp / "README.md").write_text(model_card(target.name, source, arch, decode, max_positions), encoding="utf-8")
        notes = {
            "from": source,
            "architecture": arch,
            "why": "pre-norm with final layer norms" if pre else "post-norm, no final layer norms",
            "max_positions": max_positions,
            "decode": {
                "nmt": {
                    "beam": decode.beam,
                    "alpha": decode.alpha,
                    "max_len_a": decode.max_len_a,
                    "max_len_b": decode.max_len_b,
                    "min_len": decode.min_len,
                },
                "transformers": {"num_beams": decode.beam, "length_penalty": 0.0, "suppress_tokens": [PAD, BOS]},
                "same_ranking": decode.alpha == 0,
                "nmt_search": "model.generate(**batch, custom_generate=DIR, trust_remote_code=True)",
                "equal_outputs": EQUAL_OUTPUTS,
            },
        }
        (tmp / "nmt_export.json").write_text(json.dumps(notes, indent=1) + "\n", encoding="utf-8")
        check_same(model, transformers.AutoModelForSeq2SeqLM.from_pretrained(str(tmp)).eval(), vocab)
    return target


def check_same(model: Seq2Seq, hf_model, vocab: int, seed: int = 0) -> None:
    """The written model, loaded back as Transformers loads it, gives our teacher-forced log-probabilities on random
    sentences (within 1e-4), or the export fails with one line."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 9), generator=g)
    src[:, -1] = EOS
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[0, 6:], src[0, 6:] = False, PAD  # one shorter, padded sentence
    src[0, 5] = EOS
    tgt = torch.randint(4, vocab, (3, 7), generator=g)
    tgt[:, 0] = BOS
    with torch.no_grad():
        ours = model(src, src_mask, tgt).log_softmax(-1)
        theirs = hf_model(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits.log_softmax(-1)
    error = float((ours - theirs).abs().max())
    if not error < 1e-4:
        raise NmtError(
            f"format=hf: the exported model does not compute what ours does (max log-prob error {error:.2e})"
        )


def _write_tokenizer(tokenizer: Tokenizer, folder: Path, max_positions: int) -> None:
    """MarianTokenizer's files: the SentencePiece model as source.spm and target.spm, vocab.json piece -> our id."""
    (folder / "source.spm").write_bytes(tokenizer.src_model)
    (folder / "target.spm").write_bytes(tokenizer.src_model)
    sp = tokenizer.src
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    specials = {PAD: "<pad>", UNK: "<unk>", BOS: "<s>", EOS: "</s>"}
    for i, name in specials.items():
        vocab.pop(sp.id_to_piece(i), None)
        vocab[name] = i
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": "src",
        "target_lang": "tgt",
        "unk_token": "<unk>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": max_positions,
        "separate_vocabs": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"unk_token": "<unk>", "eos_token": "</s>", "pad_token": "<pad>"}) + "\n", encoding="utf-8"
    )
