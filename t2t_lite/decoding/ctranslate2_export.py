"""A trained Transformer as a CTranslate2 model directory.

CTranslate2 is the C++ inference engine that OpenNMT-tf, OpenNMT-py, fairseq and
Marian models convert to (int8/float16 weights, cached beam search, batch
reordering). Its converters read a framework's checkpoint and fill a
`TransformerSpec`; this one fills it from t2t_lite's Keras layers, through the same
`ctranslate2.converters.Converter` base class the built-in converters use (it
validates the spec, quantizes and writes the directory).

Every property of the architecture that decides the outputs is checked against what
the spec expresses (`ARCHITECTURE`); a model that differs in any of them is refused
with one line naming it, rather than converted into a model that translates
differently. How each maps:

- pre-norm layers with a final norm on both stacks: `pre_norm=True`;
- q/k/v/output projections without bias, the query scaled by depth^-1/2 (CTranslate2's
  default scale); the self-attention's q, k, v fused as CTranslate2 expects;
- embeddings times sqrt(hidden): `scale_embeddings` (CTranslate2's default);
- T2T's sinusoid (sin half, then cos half, timescales 1..1e4): written as an explicit
  position table, so no formula has to agree;
- the decoder's first position, whose input is the padding id with a zeroed
  embedding: `start_from_zero_embedding` (the start token's own row is never read);
- layer-norm epsilon: the model's `norm_epsilon`; ReLU feed-forward with biases;
- shared or separate embeddings and softmax: the arrays as they are (CTranslate2
  stores a shared one once);
- no relative attention (t2t_lite's Transformer has none).
"""

import json
import os
import shutil

import numpy as np

from t2t_lite.constants import EOS_ID, PAD_ID
from t2t_lite.data.vocab import UNK_ID, SubwordVocab
from t2t_lite.decoding.export import (
    check_export_dir,
    default_export_dir,
    staged_directory,
)
from t2t_lite.errors import UserError
from t2t_lite.models.layers import get_timing_signal_1d
from t2t_lite.models.transformer import Transformer

INFO_FILE = "t2t_ctranslate2.json"
# The position table covers the longest input plus this many output tokens beyond it:
# CTranslate2 cannot decode past its table (t2t-decoder's extra_length is 50).
EXTRA_POSITIONS = 512

# What t2t_lite's Transformer is, property by property; `architecture(model)` reads
# the same properties off a built model, and a model that differs is refused.
ARCHITECTURE = {
    "class": "t2t_lite Transformer",
    "normalization": "pre-norm, final layer norm on encoder and decoder",
    "attention projections": "no bias",
    "feed-forward": "relu, with biases",
    "embedding scale": "sqrt(hidden_size)",
    "position encoding": "T2T sinusoid (sin half, cos half)",
    "decoder first position": "zero embedding",
    "relative attention": "none",
}


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            "CTranslate2 is not installed: pip install -e '.[ctranslate2]' "
            "(or pip install ctranslate2)."
        ) from None
    return ctranslate2


def quantization_types():
    """The weight types CTranslate2 accepts, as its converters name them."""
    _ctranslate2()  # one line if it is not installed
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    return ACCEPTED_MODEL_TYPES


def check_quantization(quantization):
    """A UserError unless quantization is empty or a type CTranslate2 knows."""
    if quantization and quantization not in quantization_types():
        raise UserError(
            f"--quantization {quantization!r}: CTranslate2 knows "
            f"{', '.join(quantization_types())}."
        )


def architecture(model):
    """ARCHITECTURE's properties as this model has them. A subclass or a user's model
    that changes a layer shows here and is then refused by `check_convertible`."""
    if type(model) is not Transformer:  # a subclass may change anything
        return {"class": f"{type(model).__module__}.{type(model).__name__}"}
    norm_types = {type(layer.self_attention_norm) for layer in model.encoder_layers}
    attentions = [
        layer.self_attention for layer in model.encoder_layers + model.decoder_layers
    ] + [layer.encdec_attention for layer in model.decoder_layers]
    denses = [
        d for a in attentions for d in (a.q_dense, a.k_dense, a.v_dense, a.output_dense)
    ]
    ffns = [layer.ffn for layer in model.encoder_layers + model.decoder_layers]
    activations = {f.filter_dense.activation.__name__ for f in ffns}
    ffn_biases = all(f.filter_dense.use_bias and f.output_dense.use_bias for f in ffns)
    return {
        **ARCHITECTURE,
        "normalization": ARCHITECTURE["normalization"]
        if len(norm_types) == 1
        else f"mixed norms {sorted(t.__name__ for t in norm_types)}",
        "attention projections": "no bias"
        if not any(d.use_bias for d in denses)
        else "with bias",
        "feed-forward": f"{'/'.join(sorted(activations))}, "
        f"{'with biases' if ffn_biases else 'without biases'}",
    }


def check_convertible(model, problem):
    """One UserError naming the first property that does not map; returns the
    (source, target) SubwordVocab, whose pieces become CTranslate2's vocabularies."""
    found = architecture(model)
    for key, wanted in ARCHITECTURE.items():
        if found.get(key) != wanted:
            raise UserError(
                f"cannot convert to CTranslate2: {key} is {found.get(key)!r}, the "
                f"conversion maps only {wanted!r}."
            )
    vocabs = (
        getattr(problem, "source_vocab", None),
        getattr(problem, "target_vocab", None),
    )
    if not all(isinstance(v, SubwordVocab) for v in vocabs):
        raise UserError(
            f"cannot convert to CTranslate2: problem {problem.name} has no "
            "SentencePiece vocabulary (CTranslate2 models take token strings)."
        )
    return vocabs


def _pieces(vocab):
    """The vocabulary in id order. Pad, EOS and unk keep SentencePiece's own names
    (<pad>, </s>, <unk>), which are CTranslate2's defaults too."""
    pieces = [vocab.id_to_piece(i) for i in range(vocab.size)]
    assert pieces[EOS_ID] == "</s>" and pieces[UNK_ID] == "<unk>", pieces[:3]
    assert pieces[PAD_ID] == "<pad>", pieces[:3]
    return pieces


def _array(variable):
    return np.asarray(variable.numpy(), dtype=np.float32)


def _linear(spec, dense):
    """A Keras Dense ([in, out] kernel) into a CTranslate2 linear ([out, in])."""
    spec.weight = _array(dense.kernel).T
    if dense.use_bias:
        spec.bias = _array(dense.bias)


def _fused(spec, denses):
    """Several bias-free projections of the same input as one linear: their
    kernels side by side, as CTranslate2's fused q/k/v and k/v expect."""
    spec.weight = np.concatenate([_array(d.kernel).T for d in denses], axis=0)


def _norm(spec, layer):
    spec.gamma, spec.beta = _array(layer.gamma), _array(layer.beta)


def _attention(spec, attention, self_attention):
    if self_attention:
        _fused(
            spec.linear[0], [attention.q_dense, attention.k_dense, attention.v_dense]
        )
    else:
        _linear(spec.linear[0], attention.q_dense)
        _fused(spec.linear[1], [attention.k_dense, attention.v_dense])
    _linear(spec.linear[-1], attention.output_dense)


def _feed_forward(spec, ffn, norm):
    _norm(spec.layer_norm, norm)
    _linear(spec.linear_0, ffn.filter_dense)
    _linear(spec.linear_1, ffn.output_dense)


def transformer_spec(model, source_pieces, target_pieces, max_positions):
    """The filled `TransformerSpec` of a t2t_lite Transformer (check_convertible
    first). max_positions: rows of the position table."""
    from ctranslate2.specs import transformer_spec as ct2

    config = model.config
    spec = ct2.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=True,
    )
    timing = get_timing_signal_1d(max_positions, config.hidden_size)[0].numpy()
    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = _array(model.source_embedding.weights_matrix)
    encoder.position_encodings.encodings = timing
    _norm(encoder.layer_norm, model.encoder_norm)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
        _norm(layer_spec.self_attention.layer_norm, layer.self_attention_norm)
        _attention(layer_spec.self_attention, layer.self_attention, True)
        _feed_forward(layer_spec.ffn, layer.ffn, layer.ffn_norm)
    decoder.embeddings.weight = _array(model.target_embedding.weights_matrix)
    decoder.start_from_zero_embedding = True
    decoder.position_encodings.encodings = timing
    _norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = _array(model.softmax.weights_matrix)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
        _norm(layer_spec.self_attention.layer_norm, layer.self_attention_norm)
        _attention(layer_spec.self_attention, layer.self_attention, True)
        _norm(layer_spec.attention.layer_norm, layer.encdec_attention_norm)
        _attention(layer_spec.attention, layer.encdec_attention, False)
        _feed_forward(layer_spec.ffn, layer.ffn, layer.ffn_norm)
    spec.config.layer_norm_epsilon = float(config.norm_epsilon)
    # The start token's embedding is replaced by zeros: any token in the vocabulary
    # will do, and EOS is always there. Sources get EOS appended as t2t_lite's
    # encoders do, so a client passes SentencePiece's pieces as they come.
    spec.config.bos_token = spec.config.decoder_start_token = "</s>"
    spec.config.add_source_eos = True
    spec.register_source_vocabulary(source_pieces)
    spec.register_target_vocabulary(target_pieces)
    return spec


def convert(model, problem, export_dir, info, quantization=None, overwrite=False):
    """Writes model as a CTranslate2 directory: the converted weights and
    vocabularies, the SentencePiece model file(s), and info (+ what the conversion
    chose) as t2t_ctranslate2.json. Written next to export_dir first, so a failed
    conversion leaves nothing behind. Returns the info written."""
    ctranslate2 = _ctranslate2()
    source, target = check_convertible(model, problem)
    check_quantization(quantization)
    max_positions = info["max_input_length"] + EXTRA_POSITIONS
    spec = transformer_spec(model, _pieces(source), _pieces(target), max_positions)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    info = {
        **info,
        "format": "ctranslate2",
        "ctranslate2_version": ctranslate2.__version__,
        "quantization": quantization or "float32",
        "max_positions": max_positions,
        "source_vocab": os.path.basename(source.path),
        "target_vocab": os.path.basename(target.path),
    }
    check_export_dir(export_dir, overwrite)
    with staged_directory(export_dir, (OSError, RuntimeError, ValueError)) as staging:
        _Converter().convert(staging, quantization=quantization, force=True)
        for path in sorted({source.path, target.path}):  # shared: once
            shutil.copy(path, staging)
        with open(os.path.join(staging, INFO_FILE), "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
    return info


def default_dir(run_dir, checkpoint_path):
    """RUN/export_ctranslate2/N for checkpoint RUN/model-N: beside RUN/export/, not
    in it, which TF Serving reads as numbered SavedModel versions."""
    numbered = default_export_dir(run_dir, checkpoint_path)
    return os.path.join(run_dir, "export_ctranslate2", os.path.basename(numbered))


def read_info(ct2_dir, flag="--ct2_dir"):
    """A converted directory's t2t_ctranslate2.json, or a UserError saying what is
    missing."""
    path = os.path.join(ct2_dir, INFO_FILE)
    if not os.path.isdir(ct2_dir):
        raise UserError(f"{flag} '{ct2_dir}' is not a directory.")
    if not os.path.isfile(path):
        raise UserError(
            f"{flag} '{ct2_dir}' holds no {INFO_FILE}: convert the run with "
            "t2t-exporter --format=ctranslate2."
        )
    with open(path) as f:
        return json.load(f)
