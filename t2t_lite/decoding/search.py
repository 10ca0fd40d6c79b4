"""Greedy and beam search over any step function, compiled as tf.while_loops.

The searches know nothing about the Transformer. They call

    step_fn(ids, index, state) -> (logits [N, vocab], new_state)

where `ids` int32 [N, decode_length + 1] holds the decoder inputs: position 0 is 0 (the
start, as in training's shift_right), position i > 0 the token chosen at step i - 1,
zeros after `index`. `state` is a nest of tensors with leading dimension N (the
key/value cache, growing by one position a step, or nothing for a step function that
recomputes the prefix); beam search reorders it along with the hypotheses. N is batch
(greedy) or batch * beam.

Beam search follows T2T (GNMT length penalty ((5 + length) / 6) ** alpha, 2 * beam
candidates per step so a beam never runs dry of unfinished hypotheses, stop once no
unfinished hypothesis can beat the finished ones) with fairseq's rule that a
hypothesis ending in EOS is finished only if it ranks among the best `beam_size`
candidates of its step. That rule makes beam_size 1 with alpha 0 exactly greedy; T2T's
version could finish a worse, earlier EOS instead. As in T2T, a finished hypothesis
always outranks one that merely ran out of decode_length; the padding id is never
chosen (fairseq).
"""

import tensorflow as tf

from t2t_lite.constants import EOS_ID, NEG_INF, PAD_ID


def length_penalty(length, alpha):
    """GNMT's ((5 + length) / 6) ** alpha; length counts tokens including EOS."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _without_padding(scores):
    """scores [N, vocab] with the padding id made impossible: padding is not a token
    (fairseq does the same); chosen, it would read as the start symbol next step."""
    return scores + tf.one_hot(PAD_ID, tf.shape(scores)[-1], on_value=NEG_INF)


def _invariants(loop_vars):
    """Loop-variable shapes: fixed, except `state` (the last), whose tensors may
    change shape from step to step (a key/value cache grows by one position)."""
    *fixed, state = loop_vars
    relaxed = tf.nest.map_structure(
        lambda t: tf.TensorShape([None] * t.shape.rank), state
    )
    return (*[tf.convert_to_tensor(v).shape for v in fixed], relaxed)


def _write_column(ids, column, values):
    """ids [..., L] with ids[..., column] = values [...]; that column was zero."""
    one_hot = tf.one_hot(column, tf.shape(ids)[-1], dtype=ids.dtype)  # [L]
    return ids + values[..., None] * one_hot


def greedy_search(step_fn, state, batch_size, decode_length, eos_id=EOS_ID):
    """Picks the most likely token at each step until every sequence has EOS.

    Returns (ids int32 [batch, decode_length]: outputs with EOS, zeros after it;
    log_probs float32 [batch]: the sum of the chosen tokens' log-probabilities).
    """
    ids = tf.zeros([batch_size, decode_length + 1], tf.int32)
    finished = tf.zeros([batch_size], tf.bool)
    log_probs = tf.zeros([batch_size], tf.float32)

    def not_done(index, ids, finished, log_probs, state):
        del ids, log_probs, state
        return tf.logical_and(index < decode_length, ~tf.reduce_all(finished))

    def step(index, ids, finished, log_probs, state):
        logits, state = step_fn(ids, index, state)  # [batch, vocab]
        token_log_probs = tf.nn.log_softmax(logits)
        chosen = tf.argmax(_without_padding(logits), axis=-1, output_type=tf.int32)
        chosen = tf.where(finished, 0, chosen)  # padding after EOS
        gained = tf.gather(token_log_probs, chosen, batch_dims=1)  # [batch]
        log_probs += tf.where(finished, 0.0, gained)
        ids = _write_column(ids, index + 1, chosen)
        finished = tf.logical_or(finished, tf.equal(chosen, eos_id))
        return index + 1, ids, finished, log_probs, state

    loop_vars = (tf.constant(0), ids, finished, log_probs, state)
    _, ids, _, log_probs, _ = tf.while_loop(
        not_done, step, loop_vars, shape_invariants=_invariants(loop_vars)
    )
    return ids[:, 1:], log_probs


def _gather_beams(tensor, indices, batch_size, beam_size):
    """tensor [batch * old_beams, ...] -> [batch * new_beams, ...] picking beams
    indices [batch, new_beams] of each batch entry (hypotheses and their cache)."""
    shape = tf.shape(tensor)
    by_batch = tf.reshape(tensor, tf.concat([[batch_size, -1], shape[1:]], axis=0))
    picked = tf.gather(by_batch, indices, batch_dims=1)  # [batch, new_beams, ...]
    return tf.reshape(picked, tf.concat([[batch_size * beam_size], shape[1:]], axis=0))


def _top_k_gather(scores, k, *tensors):
    """The k best by `scores` [batch, m] and the matching entries of each tensor
    [batch, m, ...], sorted best first. Returns (scores, indices, *tensors)."""
    top_scores, indices = tf.math.top_k(scores, k=k)
    return (top_scores, indices) + tuple(
        tf.gather(t, indices, batch_dims=1) for t in tensors
    )


def beam_search(
    step_fn,
    state,
    batch_size,
    beam_size,
    vocab_size,
    decode_length,
    alpha=0.6,
    eos_id=EOS_ID,
    stop_on_best_only=True,
):
    """Beam search; `state` and step_fn's N dimension are batch * beam (each batch
    entry's beams adjacent, e.g. tf.repeat(x, beam_size, axis=0)).

    stop_on_best_only: stop when the best finished hypothesis can no longer be beaten
    (enough for a 1-best answer); False waits until all beam_size finished ones are
    safe (for n-best lists).
    Returns (ids int32 [batch, beam, decode_length]: EOS-terminated, zeros after, unless
    decode_length ran out first; scores float32 [batch, beam]: log-probability / length
    penalty). Finished hypotheses come first, best first; unfinished ones (no EOS
    within decode_length) only fill slots left over, also best first.
    """
    k, seq_length = beam_size, decode_length + 1
    max_penalty = length_penalty(decode_length, alpha)

    def not_done(index, alive_ids, alive_log_probs, finished_ids, scores, flags, st):
        del alive_ids, finished_ids, st
        settled = _settled(
            alive_log_probs, scores, flags, max_penalty, stop_on_best_only
        )
        return tf.logical_and(index < decode_length, ~settled)

    def step(index, alive_ids, alive_log_probs, finished_ids, scores, flags, state):
        flat_ids = tf.reshape(alive_ids, [batch_size * k, seq_length])
        logits, state = step_fn(flat_ids, index, state)  # [batch * k, vocab]
        log_probs = _without_padding(tf.nn.log_softmax(logits))
        log_probs = tf.reshape(log_probs, [batch_size, k, vocab_size])
        log_probs += alive_log_probs[:, :, None]  # [batch, k, vocab]
        penalty = length_penalty(index + 1, alpha)
        cand_scores, cand_beam, cand_ids = _candidates(
            log_probs / penalty, alive_ids, index
        )
        cand_eos = tf.equal(cand_ids[:, :, index + 1], eos_id)  # [batch, 2k]
        alive_ids, alive_log_probs, state = _keep_alive(
            cand_scores, cand_beam, cand_ids, cand_eos, penalty, state
        )
        scores, finished_ids, flags = _add_finished(
            scores, finished_ids, flags, cand_scores, cand_ids, cand_eos
        )
        return index + 1, alive_ids, alive_log_probs, finished_ids, scores, flags, state

    loop_vars = (tf.constant(0), *_empty_beams(batch_size, k, seq_length), state)
    index, alive_ids, alive_log_probs, finished_ids, scores, flags, _ = tf.while_loop(
        not_done, step, loop_vars, shape_invariants=_invariants(loop_vars)
    )
    alive_scores = alive_log_probs / length_penalty(index, alpha)
    ids, scores = _finished_then_alive(
        finished_ids, scores, flags, alive_ids, alive_scores
    )
    return ids[:, :, 1:], scores


def _empty_beams(batch_size, k, seq_length):
    """The loop's start: (alive ids, alive log-probs, finished ids, finished scores,
    finished flags), nothing finished."""
    alive_ids = tf.zeros([batch_size, k, seq_length], tf.int32)
    # Only beam 0 is live at first, so step 0 does not expand k identical copies.
    alive_log_probs = tf.tile([[0.0] + [NEG_INF] * (k - 1)], [batch_size, 1])
    finished_ids = tf.zeros([batch_size, k, seq_length], tf.int32)
    finished_scores = tf.fill([batch_size, k], NEG_INF)
    finished_flags = tf.zeros([batch_size, k], tf.bool)
    return alive_ids, alive_log_probs, finished_ids, finished_scores, finished_flags


def _settled(alive_log_probs, scores, flags, max_penalty, stop_on_best_only):
    """Whether no unfinished hypothesis can still beat the finished ones (the best
    one, or with stop_on_best_only False the worst of k), for every batch entry."""
    # An unfinished hypothesis' score can only fall, to at best its log-prob now
    # divided by the largest penalty.
    best_possible = alive_log_probs[:, 0] / max_penalty  # [batch]
    if stop_on_best_only:
        bar = tf.reduce_max(tf.where(flags, scores, NEG_INF), axis=1)
    else:
        worst = tf.reduce_min(tf.where(flags, scores, -NEG_INF), axis=1)
        bar = tf.where(tf.reduce_all(flags, axis=1), worst, NEG_INF)
    return tf.reduce_all(bar > best_possible)


def _candidates(scores, alive_ids, index):
    """The step's 2k best continuations by `scores` [batch, k, vocab] (length-
    penalized): (their scores [batch, 2k], the beam each extends [batch, 2k], their
    ids [batch, 2k, length] with the new token in column index + 1), best first.
    2k, so that even if k of them end in EOS, k unfinished ones remain."""
    k, vocab_size = scores.shape[1], scores.shape[2]
    flat_scores = tf.reshape(scores, [-1, k * vocab_size])
    cand_scores, cand_index = tf.math.top_k(flat_scores, k=2 * k)  # [batch, 2k]
    cand_beam = cand_index // vocab_size
    cand_ids = tf.gather(alive_ids, cand_beam, batch_dims=1)  # [batch, 2k, len]
    cand_ids = _write_column(cand_ids, index + 1, cand_index % vocab_size)
    return cand_scores, cand_beam, cand_ids


def _keep_alive(cand_scores, cand_beam, cand_ids, cand_eos, penalty, state):
    """The best k candidates not ending in EOS: (their ids, their log-probs, the
    state reordered to match them)."""
    batch_size, k = tf.shape(cand_scores)[0], cand_scores.shape[1] // 2
    _, _, alive_ids, alive_log_probs, from_beam = _top_k_gather(
        cand_scores + tf.cast(cand_eos, tf.float32) * NEG_INF,
        k,
        cand_ids,
        cand_scores * penalty,
        cand_beam,
    )
    state = tf.nest.map_structure(
        lambda t: _gather_beams(t, from_beam, batch_size, k), state
    )
    return alive_ids, alive_log_probs, state


def _add_finished(scores, finished_ids, flags, cand_scores, cand_ids, cand_eos):
    """The k best of the finished hypotheses and the step's new ones: candidates
    that end in EOS and rank among the step's best k (fairseq's rule)."""
    k = flags.shape[1]
    in_top_k = tf.range(2 * k) < k  # candidates come sorted best first
    newly = tf.logical_and(cand_eos, in_top_k[None, :])
    scores, _, finished_ids, flags = _top_k_gather(
        tf.concat([scores, tf.where(newly, cand_scores, NEG_INF)], axis=1),
        k,
        tf.concat([finished_ids, cand_ids], axis=1),
        tf.concat([flags, newly], axis=1),
    )
    return scores, finished_ids, flags


def _finished_then_alive(finished_ids, finished_scores, flags, alive_ids, alive_scores):
    """Per batch entry: its f finished hypotheses (sorted, a prefix since unflagged
    slots score NEG_INF), then its best k - f unfinished ones. Finished come first
    as in T2T: an unfinished hypothesis that merely ran out of decode_length never
    paid for its EOS, so it must not outrank them."""
    k = tf.shape(flags)[1]
    num_finished = tf.reduce_sum(tf.cast(flags, tf.int32), axis=1)[
        :, None
    ]  # [batch, 1]
    slot = tf.range(k)[None, :]  # [1, k]
    pick = tf.where(slot < num_finished, slot, k + slot - num_finished)  # [batch, k]
    ids = tf.gather(tf.concat([finished_ids, alive_ids], 1), pick, batch_dims=1)
    scores = tf.gather(
        tf.concat([finished_scores, alive_scores], 1), pick, batch_dims=1
    )
    return ids, scores
