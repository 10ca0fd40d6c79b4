"""Exporting a trained run as a SavedModel that translates text (t2t-exporter).

The exported graph is the decoder's own: `Translator` wraps a `Decoder` and calls its
compiled search (decoding/search.py over the model's key/value cache) inside the
signature, so an export translates exactly as `t2t-decoder` does with the same
decode hparams. Around the search, the graph does in TensorFlow ops what
`Decoder.decode_ids` does in Python:

- inputs longer than max_input_length (EOS included) keep their first
  max_input_length - 1 tokens and EOS;
- empty inputs (no token before EOS) give an empty output and score 0 without
  running the model;
- the other inputs are sorted longest first and searched in batches of the decode
  hparams' batch_size, each padded to its longest input (its decode length is that
  length + extra_length), then put back in input order.

Text problems tokenize and detokenize inside the graph with tensorflow-text's
`SentencepieceTokenizer` holding the problem's SentencePiece model(s) (one shared, or
one per side); loading such an export needs `import tensorflow_text` first (it
registers the SentencePiece ops). Problems without SentencePiece (the algorithmic
ones) export the ids signature only.

Signatures (beam_size, alpha, batch_size, extra_length and max_input_length are
export options, baked in; the beam size shapes the search's tensors, alpha does not):

- `serving_default` (text problems): sentences string [batch] ->
  {"translations": string [batch], "scores": float32 [batch]}.
- `translate_with_alpha` (text problems): the same with an `alpha` float32 [] input
  (the length penalty's exponent) instead of the export's.
- `translate_ids`: inputs int32 [batch, length] (source ids as the problem encodes
  them: EOS-terminated, 0-padded) -> {"outputs": int32 [batch, out_length] (no EOS,
  0-padded), "scores": float32 [batch]}. Problems without SentencePiece export it as
  `serving_default` too.
"""

import contextlib
import json
import os
import re
import shutil
import tempfile

import tensorflow as tf

from t2t_lite.constants import EOS_ID, PAD_ID
from t2t_lite.data.vocab import UNK_ID, SubwordVocab
from t2t_lite.decoding.decoder import Decoder
from t2t_lite.errors import UserError, first_line
from t2t_lite.graph import graph_function

EXPORT_INFO_FILE = "t2t_export.json"  # in the export's assets.extra/
TEXT_SIGNATURE = "serving_default"
IDS_SIGNATURE = "translate_ids"
ALPHA_SIGNATURE = "translate_with_alpha"


def sentencepiece_vocabs(problem):
    """(source, target) SubwordVocab of a problem, or None if it has none."""
    try:
        vocabs = problem.source_vocab, problem.target_vocab
    except AttributeError:
        return None
    if all(isinstance(v, SubwordVocab) for v in vocabs):
        return vocabs
    return None


def _model_bytes(vocab):
    with open(vocab.path, "rb") as f:
        return f.read()


def _sentencepiece_tokenizer(vocab):
    """tensorflow-text's SentencepieceTokenizer for `vocab`, its model resource
    named after the vocabulary. tensorflow-text creates every model resource with
    the same (empty) shared name: a SavedModel holding two (separate source and
    target vocabularies) loads both as whichever is created first."""
    import tensorflow_text as tf_text  # registers the SentencePiece ops
    from tensorflow_text.python.ops import sentencepiece_tokenizer as sp_ops

    class NamedModelResource(sp_ops._SentencepieceModelResource):
        def _create_resource(self):
            return sp_ops.gen_sentencepiece_tokenizer.sentencepiece_op(
                model=self._model, shared_name=f"t2t_sentencepiece_{vocab.sha256}"
            )

    model = _model_bytes(vocab)
    tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)
    tokenizer._model_resource = NamedModelResource(model, None)
    return tokenizer


class Translator(tf.Module):
    """The model, its search and (text problems) its SentencePiece models, as one
    saveable module; `signatures()` gives the concrete functions to export."""

    def __init__(
        self, model, decode_hp, max_input_length, vocabs=None, flag="decode_hparams"
    ):
        """decode_hp: decode_hparams(); max_input_length: used when
        decode_hp.max_input_length is 0 (as for Decoder); vocabs: the problem's
        (source, target) SubwordVocab, or None for an ids-only export; flag: what
        to call decode_hp in error messages."""
        super().__init__(name="t2t_translator")
        # The weights, not the Keras model: saving a Keras model traces its layers
        # again (several times slower) for nothing a signature uses.
        self.model_variables = [v.value for v in model.variables]
        self._decoder = Decoder(model, decode_hp, max_input_length, flag=flag)
        self._max_input_length = self._decoder.max_input_length
        self._batch_size = decode_hp.batch_size
        self._alpha = decode_hp.alpha
        # One compiled core for both signatures: traced (and stored) once.
        self._translate_tokens = graph_function(
            self._translate_tokens_eagerly,
            input_signature=[
                tf.RaggedTensorSpec([None, None], tf.int32, row_splits_dtype=tf.int64),
                tf.TensorSpec([], tf.float32),
            ],
        )
        self._has_text = vocabs is not None
        if self._has_text:
            source, target = vocabs
            self.source_tokenizer = _sentencepiece_tokenizer(source)
            self.target_tokenizer = (
                self.source_tokenizer
                if target.sha256 == source.sha256
                else _sentencepiece_tokenizer(target)
            )
            self._target_size = target.size

    # --- the shared core: ragged source tokens -> ragged output ids --------------

    def _translate_tokens_eagerly(self, tokens, alpha):
        """tokens int32 RaggedTensor [batch, (length)]: source ids without EOS, and
        alpha (the length penalty's exponent) ->
        (int32 RaggedTensor [batch, (out)] output ids without EOS or padding,
        float32 scores [batch]); as Decoder.decode_ids, batch by batch."""
        tokens = tokens[:, : self._max_input_length - 1]  # EOS takes the last place
        lengths = tf.cast(tokens.row_lengths(), tf.int32)
        nonempty = tf.cast(tf.where(lengths > 0)[:, 0], tf.int32)
        empty = tf.cast(tf.where(lengths == 0)[:, 0], tf.int32)
        # Longest first with ties in input order: Decoder.decode_ids's batches.
        order = tf.gather(
            nonempty, tf.argsort(-tf.gather(lengths, nonempty), stable=True)
        )
        values, row_lengths, scores = self._search_in_batches(tokens, order, alpha)
        empty_rows = tf.zeros([tf.size(empty)], tf.int32)
        searched = tf.RaggedTensor.from_row_lengths(
            values, tf.concat([row_lengths, empty_rows], 0)
        )
        scores = tf.concat([scores, tf.zeros([tf.size(empty)], tf.float32)], 0)
        back = tf.math.invert_permutation(tf.concat([order, empty], 0))
        return tf.gather(searched, back), tf.gather(scores, back)

    def _search_in_batches(self, tokens, order, alpha):
        """Searches tokens' rows `order` in batches of batch_size -> (flat output
        values, row lengths [len(order)], scores [len(order)]), in `order`."""
        batch_size = self._batch_size

        def arrays(dtype):  # element 0 is empty: concat() works for no batch too
            array = tf.TensorArray(dtype, size=1, dynamic_size=True, infer_shape=False)
            return array.write(0, tf.zeros([0], dtype))

        def body(start, values, row_lengths, scores):
            chunk = order[start : start + batch_size]
            sources = tf.gather(tokens, chunk)  # [chunk, (length)]
            eos = tf.RaggedTensor.from_tensor(tf.fill([tf.size(chunk), 1], EOS_ID))
            inputs = tf.concat([sources, eos], axis=1).to_tensor(PAD_ID)
            ids, chunk_scores = self._decoder._search_batch(inputs, alpha)
            best = ids[:, 0, :]  # [chunk, decode_length]: EOS, zeros after
            before_eos = tf.cumsum(tf.cast(tf.equal(best, EOS_ID), tf.int32), axis=1)
            keep = tf.logical_and(tf.equal(before_eos, 0), best != PAD_ID)
            outputs = tf.ragged.boolean_mask(best, keep)
            i = start // batch_size + 1
            return (
                start + batch_size,
                values.write(i, outputs.flat_values),
                row_lengths.write(i, tf.cast(outputs.row_lengths(), tf.int32)),
                scores.write(i, chunk_scores[:, 0]),
            )

        _, values, row_lengths, scores = tf.while_loop(
            lambda start, *_: start < tf.size(order),
            body,
            (tf.constant(0), arrays(tf.int32), arrays(tf.int32), arrays(tf.float32)),
        )
        flat = [array.concat() for array in (values, row_lengths, scores)]
        for tensor in flat:
            tensor.set_shape([None])  # the ragged ops need the rank
        return flat

    # --- signatures ----------------------------------------------------------------

    def translate_text(self, sentences, alpha=None):
        """sentences string [batch] (and alpha, float32 [], default: the export's)
        -> {"translations": string [batch], "scores": float32 [batch]}."""
        alpha = self._alpha if alpha is None else alpha
        tokens = self.source_tokenizer.tokenize(sentences)  # [batch, (length)]
        outputs, scores = self._translate_tokens(tokens, alpha)
        # As SubwordVocab.decode: ids the target vocabulary lacks read as unknown.
        known = outputs.flat_values < self._target_size
        outputs = outputs.with_flat_values(tf.where(known, outputs.flat_values, UNK_ID))
        return {
            "translations": self.target_tokenizer.detokenize(outputs),
            "scores": scores,
        }

    def translate_ids(self, inputs):
        """inputs int32 [batch, length] (EOS-terminated, 0-padded) ->
        {"outputs": int32 [batch, out_length] (no EOS, 0-padded), "scores"}."""
        before_eos = tf.cumsum(tf.cast(tf.equal(inputs, EOS_ID), tf.int32), axis=1)
        keep = tf.logical_and(tf.equal(before_eos, 0), inputs != PAD_ID)
        tokens = tf.ragged.boolean_mask(inputs, keep)
        outputs, scores = self._translate_tokens(tokens, self._alpha)
        return {"outputs": outputs.to_tensor(PAD_ID), "scores": scores}

    def signatures(self):
        """{signature name: concrete function} to pass to tf.saved_model.save."""
        ids = graph_function(
            self.translate_ids,
            input_signature=[tf.TensorSpec([None, None], tf.int32, name="inputs")],
        ).get_concrete_function()
        if not self._has_text:
            return {TEXT_SIGNATURE: ids, IDS_SIGNATURE: ids}
        sentences = tf.TensorSpec([None], tf.string, name="sentences")
        text = graph_function(self.translate_text, input_signature=[sentences])
        with_alpha = graph_function(
            self.translate_text,
            input_signature=[sentences, tf.TensorSpec([], tf.float32, name="alpha")],
        )
        return {
            TEXT_SIGNATURE: text.get_concrete_function(),
            ALPHA_SIGNATURE: with_alpha.get_concrete_function(),
            IDS_SIGNATURE: ids,
        }


def default_export_dir(run_dir, checkpoint_path):
    """RUN/export/N for checkpoint RUN/model-N (N: its step number)."""
    name = os.path.basename(checkpoint_path)
    match = re.search(r"-(\d+)$", name)
    return os.path.join(run_dir, "export", match.group(1) if match else name)


def check_export_dir(export_dir, overwrite, flag="export_dir", overwrite_flag=None):
    """A UserError if export_dir holds anything and overwrite is off; flag and
    overwrite_flag name the inputs in the message (a CLI passes its flags)."""
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise UserError(f"{flag} '{export_dir}' is a file, not a directory.")
    if os.path.isdir(export_dir) and os.listdir(export_dir) and not overwrite:
        raise UserError(
            f"{flag} '{export_dir}' is not empty; give another one, or "
            f"{overwrite_flag or 'overwrite'} to replace it."
        )


@contextlib.contextmanager
def staged_directory(export_dir, errors=(OSError,)):
    """Yields a temporary directory next to export_dir to write into; when the block
    ends, it replaces export_dir (already checked: empty, or to be overwritten), so
    an interrupted or failed export leaves no half-written directory. `errors`
    raised inside become one-line UserErrors; anything else propagates."""
    parent = os.path.dirname(os.path.abspath(export_dir))
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".export-", dir=parent)
    except OSError as e:
        raise UserError(f"export_dir '{export_dir}': {e.strerror}.") from None
    try:
        yield staging
        if os.path.isdir(export_dir):  # empty, or overwrite
            shutil.rmtree(export_dir)
        os.replace(staging, export_dir)
    except errors as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(
            f"cannot write export_dir '{export_dir}': {first_line(e)}"
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_export(translator, export_dir, info, vocabs=None, overwrite=False):
    """Writes the SavedModel to export_dir via a temporary directory next to it (an
    interrupted export leaves no half-written one), with info (a JSON-able dict)
    and the SentencePiece model files in its assets.extra/. Returns the signatures'
    {name: ([input TensorSpec], {output name: TensorSpec})}."""
    check_export_dir(export_dir, overwrite)
    with staged_directory(export_dir, (OSError, tf.errors.OpError)) as staging:
        signatures = translator.signatures()
        tf.saved_model.save(translator, staging, signatures=signatures)
        extra = os.path.join(staging, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        for path in sorted({vocab.path for vocab in vocabs or ()}):  # shared: once
            shutil.copy(path, extra)
        with open(os.path.join(extra, EXPORT_INFO_FILE), "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
    return {
        name: (
            [spec for spec in tf.nest.flatten(fn.structured_input_signature) if spec],
            fn.structured_outputs,
        )
        for name, fn in signatures.items()
    }
