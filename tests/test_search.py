"""Greedy and beam search on constructed step functions (no model): the search logic
itself — EOS handling, length penalty, beam 1 == greedy, sorted n-best lists."""

import math

import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.decoding.search import EOS_ID, beam_search, greedy_search

VOCAB = 6  # 0 pad, 1 EOS, 2..5 symbols


def table_step_fn(log_probs_by_index):
    """A step function whose next-token distribution depends only on the position:
    log_probs_by_index [steps, vocab]."""
    table = tf.constant(np.log(np.asarray(log_probs_by_index, np.float32)))

    def step_fn(ids, index, state):
        row = table[tf.minimum(index, table.shape[0] - 1)]
        return tf.tile(row[None, :], [tf.shape(ids)[0], 1]), state

    return step_fn


def markov_step_fn(seed, vocab=VOCAB):
    """Logits depend on the previous token and the position (like a tiny LM), so
    different prefixes lead to different continuations."""
    rng = np.random.default_rng(seed)
    by_token = tf.constant(rng.normal(0, 2, [vocab, vocab]).astype(np.float32))
    by_index = tf.constant(rng.normal(0, 1, [64, vocab]).astype(np.float32))

    def step_fn(ids, index, state):
        last = tf.gather(ids, index, axis=1)  # [N]
        logits = tf.gather(by_token, last) + by_index[index][None, :]
        return logits, state

    return step_fn


def test_length_penalty_changes_the_choice():
    # Step 0: EOS 0.5, "2" 0.45; then "3" 0.95; then EOS 0.95.
    # [EOS] has log-prob -0.69; [2, 3, EOS] has -0.90: better only once normalized
    # by ((5 + 3) / 6) ** alpha with alpha = 2 (-0.51).
    step_fn = table_step_fn(
        [
            [1e-6, 0.5, 0.45, 0.05 - 2e-6, 1e-6, 1e-6],
            [1e-6, 0.01, 0.01, 0.95, 0.03 - 2e-6, 1e-6],
            [1e-6, 0.95, 0.02, 0.01, 0.02 - 2e-6, 1e-6],
            [1e-6, 0.95, 0.02, 0.01, 0.02 - 2e-6, 1e-6],
        ]
    )

    def best(alpha):
        ids, scores = beam_search(step_fn, (), 1, 2, VOCAB, 8, alpha=alpha)
        return ids[0, 0].numpy().tolist()[:4], float(scores[0, 0])

    short, short_score = best(0.0)
    long, long_score = best(2.0)
    assert short[:1] == [EOS_ID]
    assert long[:3] == [2, 3, EOS_ID]
    assert short_score == pytest.approx(math.log(0.5), abs=1e-4)
    expected = (math.log(0.45) + 2 * math.log(0.95)) / ((5 + 3) / 6) ** 2
    assert long_score == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_beam_of_one_equals_greedy(seed):
    step_fn = markov_step_fn(seed)
    greedy_ids, greedy_log_probs = greedy_search(step_fn, (), 3, 12)
    beam_ids, beam_scores = beam_search(step_fn, (), 3, 1, VOCAB, 12, alpha=0.0)
    np.testing.assert_array_equal(beam_ids[:, 0].numpy(), greedy_ids.numpy())
    np.testing.assert_allclose(beam_scores[:, 0], greedy_log_probs, rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("decode_length", [3, 10])
def test_n_best_lists_are_sorted_and_distinct(alpha, decode_length):
    """Finished hypotheses first, best first; then unfinished ones (decode_length ran
    out: likely at 3 steps), best first."""
    step_fn = markov_step_fn(7)
    ids, scores = beam_search(
        step_fn, (), 2, 3, VOCAB, decode_length, alpha=alpha, stop_on_best_only=False
    )
    seen_unfinished = False
    for rows, row_scores in zip(ids.numpy(), scores.numpy()):
        assert len({tuple(row) for row in rows}) == 3
        assert np.all(row_scores > -1e8)  # every slot holds a real hypothesis
        finished = np.array([EOS_ID in row for row in rows])
        assert not np.any(finished[1:] & ~finished[:-1])  # finished ones first
        for group in (row_scores[finished], row_scores[~finished]):
            assert np.all(np.diff(group) <= 0), row_scores
        seen_unfinished |= not finished.all()
    if decode_length == 10:
        assert not seen_unfinished


def test_a_finished_hypothesis_outranks_one_that_ran_out_of_length():
    """[2, 2, 2, 2, 2] never ends (EOS 1e-6 after step 0) and its per-token score
    beats [EOS]'s; it only ran out of decode_length, so [EOS] is the answer (T2T)."""
    step_fn = table_step_fn(
        [[1e-6, 0.3, 0.69, 0.01 - 3e-6, 1e-6, 1e-6]]
        + [[1e-6, 1e-6, 0.999, 0.001 - 3e-6, 1e-6, 1e-6]] * 4
    )
    ids, scores = beam_search(step_fn, (), 1, 2, VOCAB, 5, alpha=0.6)
    assert ids[0, 0].numpy().tolist() == [EOS_ID, 0, 0, 0, 0]
    assert float(scores[0, 0]) == pytest.approx(math.log(0.3), abs=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_stopping_early_keeps_the_best_hypothesis(seed):
    """stop_on_best_only stops once the best finished hypothesis is safe; waiting
    for all beam_size finished ones (a later stop) must not change the best."""
    step_fn = markov_step_fn(seed)
    early = beam_search(step_fn, (), 3, 3, VOCAB, 14, alpha=0.6)
    late = beam_search(step_fn, (), 3, 3, VOCAB, 14, alpha=0.6, stop_on_best_only=False)
    np.testing.assert_array_equal(early[0][:, 0], late[0][:, 0])
    np.testing.assert_allclose(early[1][:, 0], late[1][:, 0], rtol=1e-6)


def test_padding_is_never_chosen():
    pad_first = table_step_fn([[0.6, 0.1, 0.1, 0.1, 0.05, 0.05]])
    greedy_ids, _ = greedy_search(pad_first, (), 1, 4)
    beam_ids, _ = beam_search(pad_first, (), 1, 2, VOCAB, 4, stop_on_best_only=False)
    assert greedy_ids.numpy().tolist() == [[EOS_ID, 0, 0, 0]]
    for row in beam_ids.numpy()[0]:
        assert row[0] != 0


def test_beam_finds_a_sequence_at_least_as_likely_as_greedy():
    # With alpha 0 the score is the log-probability; a wider beam explores more.
    for seed in range(5):
        step_fn = markov_step_fn(seed)
        _, greedy_log_probs = greedy_search(step_fn, (), 4, 10)
        _, beam_scores = beam_search(step_fn, (), 4, 4, VOCAB, 10, alpha=0.0)
        assert np.all(beam_scores[:, 0].numpy() >= greedy_log_probs.numpy() - 1e-5)


def test_outputs_stop_at_eos_and_pad_after_it():
    step_fn = markov_step_fn(11)
    for ids in (
        greedy_search(step_fn, (), 4, 15)[0].numpy(),
        beam_search(step_fn, (), 4, 2, VOCAB, 15)[0][:, 0].numpy(),
    ):
        for row in ids:
            row = row.tolist()
            if EOS_ID in row:
                after = row[row.index(EOS_ID) + 1 :]
                assert after == [0] * len(after)
            assert 0 not in row[: row.index(EOS_ID) if EOS_ID in row else len(row)]


def test_decode_length_bounds_a_search_that_never_ends():
    never_eos = table_step_fn([[1e-9, 1e-9, 0.7, 0.3 - 2e-9, 1e-9, 1e-9]])
    ids, _ = greedy_search(never_eos, (), 2, 5)
    assert ids.shape == (2, 5)
    assert ids.numpy().tolist() == [[2] * 5, [2] * 5]
    ids, scores = beam_search(never_eos, (), 2, 2, VOCAB, 5, alpha=0.6)
    assert ids.shape == (2, 2, 5)
    assert ids[0, 0].numpy().tolist() == [2] * 5
    assert float(scores[0, 0]) == pytest.approx(
        5 * math.log(0.7) / ((5 + 5) / 6) ** 0.6, abs=1e-4
    )


def test_state_is_reordered_with_the_hypotheses():
    """A state that records each hypothesis' inputs must always match its ids: beam
    search gathers the state along with the hypotheses that survive a step."""
    inner = markov_step_fn(5)
    beam, steps = 3, 10
    checked = []

    def step_fn(ids, index, history):
        # Positions 1..index-1 were recorded by earlier steps of this hypothesis.
        tf.debugging.assert_equal(history[:, 1:index], ids[:, 1:index])
        checked.append(int(index))
        logits, _ = inner(ids, index, ())
        last = tf.gather(ids, index, axis=1)
        one_hot = tf.one_hot(index, steps + 1, dtype=tf.int32)[None, :]
        return logits, history + last[:, None] * one_hot

    history = tf.zeros([2 * beam, steps + 1], tf.int32)
    beam_search(step_fn, history, 2, beam, VOCAB, steps, stop_on_best_only=False)
    assert len(checked) >= 3
