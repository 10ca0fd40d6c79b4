"""Decoding with a real Transformer: the key/value cache is exact, batching keeps
input order, empty and over-long inputs are handled, a trained model translates (BLEU)
far better than an untrained one, and evaluations report BLEU while training."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_lite.decoding.bleu import corpus_scores
from t2t_lite.decoding.decoder import Decoder, decode_hparams
from t2t_lite.decoding.loading import load_for_decoding, restore_model, run_hparams
from t2t_lite.errors import UserError
from t2t_lite.models.config import TransformerConfig
from t2t_lite.models.layers import shift_right
from t2t_lite.models.transformer import Transformer
from t2t_lite.training.reporting.evaluation import BleuEvaluator


def _random_model(seed=0, layers=2, vocab_size=24):
    keras.utils.set_random_seed(seed)
    model = Transformer(
        TransformerConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            filter_size=64,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            num_heads=4,
            layer_prepostprocess_dropout=0.0,
            attention_dropout=0.0,
            relu_dropout=0.0,
            shared_embedding_and_softmax_weights=True,
        )
    )
    model({"inputs": tf.ones([1, 2], tf.int32), "targets": tf.ones([1, 2], tf.int32)})
    return model


def test_cached_steps_give_the_logits_of_a_full_decode():
    """On an untrained model (no confident argmax to hide errors behind), logits
    from decode_step position by position equal decode's, padded batch included."""
    model = _random_model()
    inputs = tf.constant([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], tf.int32)
    targets = tf.constant([[3, 4, 5, 6, 7, 1], [11, 12, 13, 1, 0, 0]], tf.int32)
    decoder_inputs = shift_right(targets)
    encoder_output, bias = model.encode(inputs)
    full = model.decode(decoder_inputs, encoder_output, bias).numpy()
    encdec = model.encoder_decoder_cache(encoder_output)
    cache = model.empty_self_cache(2)
    for index in range(targets.shape[1]):
        logits, cache = model.decode_step(
            decoder_inputs[:, index], index, cache, encdec, bias
        )
        np.testing.assert_allclose(logits, full[:, index], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def trained(numbers_run):
    model, problem, hp, _ = load_for_decoding(
        output_dir=numbers_run.output_dir,
        data_dir=numbers_run.data_dir,
    )
    sources, references = problem.dev_text()
    return model, problem, hp, sources[:48], references[:48]


_DECODERS = {}  # (id(model), overrides) -> (model, Decoder): one trace per setting


def _decode(model, problem, lines, overrides):
    key = (id(model), overrides)
    if key not in _DECODERS:  # the model is kept with it, so its id stays unique
        decoder = Decoder(model, decode_hparams(overrides), max_input_length=32)
        _DECODERS[key] = model, decoder
    decoder = _DECODERS[key][1]
    return decoder.translate(lines, problem.encode_inputs, problem.decode)


@pytest.mark.parametrize(
    "overrides", ["beam_size=1", "beam_size=4", "beam_size=3,return_beams=true"]
)
def test_cached_and_uncached_decoding_agree_on_a_trained_model(trained, overrides):
    model, problem, _, sources, _ = trained
    cached = _decode(model, problem, sources, overrides)
    uncached = _decode(model, problem, sources, overrides + ",use_cache=false")
    assert [[t for t, _ in h] for h in cached] == [[t for t, _ in h] for h in uncached]
    cached_scores = [s for h in cached for _, s in h]
    uncached_scores = [s for h in uncached for _, s in h]
    np.testing.assert_allclose(cached_scores, uncached_scores, rtol=1e-3, atol=1e-3)


def test_n_best_scores_are_sorted(trained):
    model, problem, _, sources, _ = trained
    results = _decode(model, problem, sources[:8], "beam_size=4,return_beams=true")
    for hypotheses in results:
        scores = [s for _, s in hypotheses]
        assert len(scores) == 4
        assert scores == sorted(scores, reverse=True)
        assert len({t for t, _ in hypotheses}) == 4


def test_a_trained_model_translates_far_better_than_an_untrained_one(trained):
    model, problem, _, sources, references = trained
    untrained = _random_model(seed=3, vocab_size=model.vocab_size)
    bleu = {}
    for name, m in (("trained", model), ("untrained", untrained)):
        results = _decode(m, problem, sources, "beam_size=4,alpha=0.6")
        bleu[name] = corpus_scores([h[0][0] for h in results], references).bleu
    assert bleu["trained"] > bleu["untrained"] + 40, bleu


def test_batching_by_length_keeps_input_order(trained):
    """Sentences decoded in length-sorted batches of 3 come back in input order
    and equal their translation decoded alone."""
    model, problem, _, sources, _ = trained
    lines = sources[:7]
    batched = _decode(model, problem, lines, "beam_size=2,batch_size=3")
    alone = [_decode(model, problem, [line], "beam_size=2")[0] for line in lines]
    assert [h[0][0] for h in batched] == [h[0][0] for h in alone]


def test_empty_and_overlong_lines(trained):
    model, problem, _, sources, _ = trained
    long_line = " ".join(sources[:20])  # ~200 subwords, max_input_length is 32
    lines = [sources[0], "", "   ", long_line, sources[1]]
    decoder = Decoder(model, decode_hparams("beam_size=2"), max_input_length=32)
    results = decoder.translate(lines, problem.encode_inputs, problem.decode)
    texts = [h[0][0] for h in results]
    assert len(texts) == 5
    assert texts[1] == texts[2] == ""
    assert texts[0] and texts[4] and texts[3]
    assert decoder.truncated == 1
    assert texts[0] == _decode(model, problem, [sources[0]], "beam_size=2")[0][0][0]


def test_decode_hparams_errors_are_one_line():
    for text, words in (
        ("beam_size=0", ["beam_size", ">= 1"]),
        ("beam_sise=4", ["beam_sise", "beam_size"]),
        ("alpha=fast", ["alpha"]),
    ):
        with pytest.raises(UserError) as error:
            decode_hparams(text)
        message = str(error.value)
        assert "\n" not in message and message.startswith("decode_hparams")
        for word in words:
            assert word in message


def test_bleu_is_reported_while_training(numbers_run):
    with open(os.path.join(numbers_run.output_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["global_step"] for r in records] == [150, 300]
    assert all(r["bleu_sentences"] == 100 for r in records)
    assert 0 <= records[0]["bleu"] <= 100
    assert records[1]["bleu"] > 50
    assert numbers_run.record["bleu"] == records[1]["bleu"]
    tags = set()
    eval_dir = os.path.join(numbers_run.output_dir, "eval")
    for name in os.listdir(eval_dir):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(eval_dir, name)):
            tags.update(v.tag for v in event.summary.value)
    assert "bleu" in tags


def test_hparams_given_on_the_command_line_must_match_the_architecture(numbers_run):
    run = numbers_run.output_dir
    same = run_hparams(run, "transformer_tiny_fake_gpu4", "learning_rate_constant=9")
    assert same.hidden_size == 128  # the run's architecture; other keys may differ
    assert same.learning_rate_constant == 9  # --hparams apply on top of the run's
    overridden = run_hparams(run, "", "max_length=7")
    assert overridden.max_length == 7 and overridden.hidden_size == 128
    with pytest.raises(UserError, match="hidden_size=128 \\(given 512\\)"):
        run_hparams(run, "transformer_base", "")


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(numbers_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(numbers_run.output_dir, run)
    for data in run.glob("model-300.data-*"):
        data.write_bytes(data.read_bytes()[:100])
    model = _random_model(layers=2, vocab_size=100)
    with pytest.raises(UserError, match=r"cannot load checkpoint .*model-150"):
        restore_model(model, "", str(run))  # falls back, then: other architecture
    loaded, _, _, path = load_for_decoding(
        output_dir=str(run),
        data_dir=numbers_run.data_dir,
    )
    assert path.endswith("model-150")
    with pytest.raises(UserError, match="damaged"):
        restore_model(loaded, str(run / "model-300.index"), str(run))


def test_bleu_evaluation_stops_between_batches_on_request(trained):
    model, problem, _, _, _ = trained
    evaluator = BleuEvaluator(model, problem, decode_hparams("batch_size=8"), 32, 32)
    polls = []

    def stop_after_two_batches():
        polls.append(1)
        return len(polls) > 2

    assert evaluator.evaluate(stop_after_two_batches) is None
    assert len(polls) == 3  # polled before each batch: 2 decoded, stopped at the 3rd
    scores = evaluator.evaluate()
    assert scores["bleu_sentences"] == 32 and scores["bleu"] > 50
