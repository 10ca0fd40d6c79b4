"""Translating sentences with a trained model: decode hparams, batching, search.

`Decoder` turns lists of source id sequences into outputs: it sorts them by length so
a batch wastes little padding, runs one compiled search per batch, and puts the
results back in input order. The batching is `BatchedDecoder`'s, which the
CTranslate2 engine (decoding/ctranslate2_engine.py) shares. `translate` does the same
from text with a problem's encode/decode functions (SentencePiece for text problems).
"""

import dataclasses

import numpy as np
import tensorflow as tf

from t2t_lite.constants import EOS_ID
from t2t_lite.decoding.search import beam_search, greedy_search, length_penalty
from t2t_lite.errors import UserError
from t2t_lite.graph import graph_function
from t2t_lite.hparams import HParams


def decode_hparams(overrides="", flag="decode_hparams"):
    """T2T's decode hparams with `overrides` ("beam_size=4,alpha=0.6") applied and
    range-checked; `flag` names the input in error messages (a CLI passes its flag)."""
    hp = HParams(
        beam_size=4,  # hypotheses kept per sentence; 1 is greedy search
        alpha=0.6,  # GNMT length penalty exponent; 0 ranks by log-probability
        batch_size=32,  # sentences decoded together
        extra_length=50,  # output may be this many tokens longer than the input
        return_beams=False,  # give all beam_size hypotheses, not just the best
        write_beam_scores=False,  # with return_beams: write each one's score
        max_input_length=0,  # longer inputs are truncated; 0: the model's max_length
        use_cache=True,  # cache keys/values; False recomputes the prefix (benchmarks)
    )
    hp.parse(overrides, name=flag)
    if hp.max_input_length == 1:
        raise UserError(f"{flag}: max_input_length must be 0 or >= 2 (EOS takes one).")
    for key, minimum in (
        ("beam_size", 1),
        ("batch_size", 1),
        ("extra_length", 1),
        ("max_input_length", 0),
        ("alpha", 0.0),
    ):
        if getattr(hp, key) < minimum:
            raise UserError(
                f"{flag}: {key} must be >= {minimum}, got {getattr(hp, key)}."
            )
    return hp


def _full_forward_step_fn(model, inputs):
    """A search step for a model with only the training contract: call it on the
    whole prefix each step (O(length²); the Transformer's cache avoids that).

    `model({"inputs", "targets"})[:, i]` predicts targets[:, i] from targets[:, :i],
    so feeding targets = ids[:, 1 : index + 2] (its last entry is padding, never
    read) yields the prediction after ids[:, : index + 1]."""

    def step_fn(ids, index, state):
        targets = ids[:, 1 : index + 2]
        logits = model({"inputs": inputs, "targets": targets}, training=False)
        return tf.cast(logits[:, index, :], tf.float32), state

    return step_fn


@dataclasses.dataclass
class Hypothesis:
    ids: list  # output ids, EOS and padding removed
    score: float  # log-probability / GNMT length penalty (greedy search too)


class BatchedDecoder:
    """What every decoding engine shares: truncating long inputs, empty inputs,
    batches of the longest sentences first, results in input order. An engine
    implements `_decode_batch`."""

    def __init__(self, hp, max_input_length, eos_id=EOS_ID):
        """hp: decode_hparams(); max_input_length: used when hp.max_input_length is
        0."""
        self.hp = hp
        self.max_input_length = hp.max_input_length or max_input_length
        self.eos_id = eos_id
        self.truncated = 0  # inputs cut to max_input_length so far

    def _decode_batch(self, sources):
        """EOS-terminated id lists, longest first -> per source a list of
        Hypothesis (beam_size of them with return_beams, else one)."""
        raise NotImplementedError

    def _prepare(self, source_ids):
        """Truncates to max_input_length (keeping the final EOS)."""
        ids = list(source_ids)
        if len(ids) > self.max_input_length:
            self.truncated += 1
            ids = ids[: self.max_input_length - 1] + [self.eos_id]
        return ids

    def decode_ids(self, sources, should_stop=lambda: False, progress=None):
        """sources: id lists ending with EOS -> per source a list of Hypothesis, best
        first (beam_size of them with return_beams, else one), in input order.

        An empty source (no tokens before EOS) gets one empty hypothesis without
        running the model, so line counts stay aligned. `should_stop` is polled
        between batches (a pre-emption signal during evaluation); None if it did.
        progress(done, total), if given, is called after each batch."""
        sources = [self._prepare(s) for s in sources]
        results = [None] * len(sources)
        todo = [
            i for i, s in enumerate(sources) if len(s) > 1 or s[:1] != [self.eos_id]
        ]
        keep = self.hp.beam_size if self.hp.return_beams else 1
        for i in set(range(len(sources))) - set(todo):
            results[i] = [Hypothesis([], 0.0)] * keep  # n-best files keep their columns
        # Longest first: a batch that does not fit in memory fails at once.
        todo.sort(key=lambda i: -len(sources[i]))
        for start in range(0, len(todo), self.hp.batch_size):
            if should_stop():
                return None
            chunk = todo[start : start + self.hp.batch_size]
            decoded = self._decode_batch([sources[i] for i in chunk])
            for i, hypotheses in zip(chunk, decoded):
                results[i] = hypotheses
            if progress:
                progress(start + len(chunk), len(todo))
        return results

    def _strip(self, ids):
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return [i for i in ids if i != 0]

    def translate(self, lines, encode, decode, should_stop=lambda: False):
        """Text lines -> per line a list of (text, score), best first (None if
        should_stop said so).

        encode(text) -> ids ending with EOS; decode(ids) -> text. A line that is
        empty (or only whitespace) translates to an empty line."""
        sources = [encode(line) if line.strip() else [self.eos_id] for line in lines]
        results = self.decode_ids(sources, should_stop)
        if results is None:
            return None
        return [[(decode(h.ids), h.score) for h in hyps] for hyps in results]


class Decoder(BatchedDecoder):
    """Greedy (beam_size 1) or beam search over a Transformer, batch by batch."""

    def __init__(
        self, model, hp, max_input_length, eos_id=EOS_ID, flag="decode_hparams"
    ):
        """hp: decode_hparams(); max_input_length: used when hp.max_input_length is 0;
        flag: what to call hp in error messages (as in decode_hparams)."""
        if 2 * hp.beam_size > model.vocab_size:
            raise UserError(
                f"{flag}: beam_size {hp.beam_size} is too large for a "
                f"vocabulary of {model.vocab_size} ids (at most "
                f"{model.vocab_size // 2})."
            )
        super().__init__(hp, max_input_length, eos_id)
        self.model = model
        self._search = graph_function(
            self._search_batch,
            input_signature=[tf.TensorSpec([None, None], tf.int32)],
        )

    # --- one batch, compiled ------------------------------------------------------

    def _search_batch(self, inputs, alpha=None):
        """inputs int32 [batch, src_len] (EOS-terminated, 0-padded) ->
        (ids [batch, beams, decode_length], scores [batch, beams]). alpha: a
        float32 scalar tensor overriding hp.alpha (an export's per-call input)."""
        hp, model = self.hp, self.model
        batch_size = tf.shape(inputs)[0]
        decode_length = tf.shape(inputs)[1] + hp.extra_length
        beams = hp.beam_size

        def per_hypothesis(t):  # [batch, ...] -> [batch * beams, ...]
            return tf.repeat(t, beams, axis=0) if beams > 1 else t

        if not hasattr(model, "decode_step"):  # any model: recompute the prefix
            state, step_fn = (), _full_forward_step_fn(model, per_hypothesis(inputs))
            return self._run_search(step_fn, state, batch_size, decode_length, alpha)
        encoder_output, bias = model.encode(inputs)
        encdec_cache = model.encoder_decoder_cache(encoder_output)
        encoder_output, bias = per_hypothesis(encoder_output), per_hypothesis(bias)
        encdec_cache = tf.nest.map_structure(per_hypothesis, encdec_cache)
        if hp.use_cache:
            state = model.empty_self_cache(batch_size * beams)

            def step_fn(ids, index, self_cache):
                last = tf.gather(ids, index, axis=1)  # [batch * beams]
                return model.decode_step(last, index, self_cache, encdec_cache, bias)

        else:
            state = ()

            def step_fn(ids, index, state):
                logits = model.decode(ids[:, : index + 1], encoder_output, bias)
                return logits[:, -1, :], state

        return self._run_search(step_fn, state, batch_size, decode_length, alpha)

    def _run_search(self, step_fn, state, batch_size, decode_length, alpha=None):
        """Greedy (beam_size 1) or beam search over step_fn ->
        (ids [batch, beams, decode_length], scores [batch, beams])."""
        hp, beams = self.hp, self.hp.beam_size
        alpha = hp.alpha if alpha is None else alpha
        if beams == 1:
            ids, scores = greedy_search(
                step_fn, state, batch_size, decode_length, self.eos_id
            )
            # Normalized like beam scores, so scores compare across beam sizes.
            lengths = tf.reduce_sum(tf.cast(ids > 0, tf.int32), axis=1)
            scores /= length_penalty(lengths, alpha)
            return ids[:, None, :], scores[:, None]
        return beam_search(
            step_fn,
            state,
            batch_size,
            beams,
            self.model.vocab_size,
            decode_length,
            alpha=alpha,
            eos_id=self.eos_id,
            stop_on_best_only=not hp.return_beams,
        )

    def _decode_batch(self, sources):
        width = max(len(s) for s in sources)
        batch = np.zeros([len(sources), width], np.int32)
        for row, source in enumerate(sources):
            batch[row, : len(source)] = source
        ids, scores = self._search(tf.constant(batch))
        ids, scores = ids.numpy(), scores.numpy()
        keep = self.hp.beam_size if self.hp.return_beams else 1
        return [
            [
                Hypothesis(self._strip(ids[row, b].tolist()), float(scores[row, b]))
                for b in range(keep)
            ]
            for row in range(len(sources))
        ]
