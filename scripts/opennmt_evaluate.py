"""Evaluates OpenNMT-tf checkpoints for scripts/opennmt_recipe.py. Runs under the
OpenNMT venv's python (TensorFlow 2.12), never imported:

  VENV/bin/python scripts/opennmt_evaluate.py SPEC.json RESULT.json

SPEC: {"model_file", "config" (onmt-main's user config; auto_config is merged
under it as `onmt-main --auto_config` does), "checkpoints": [paths], "dev_source",
"dev_target" (SentencePiece pieces, the whole dev split), "bleu_source" (pieces of
the sentences to translate), "output_dir", "greedy" and "beam" (decoding params:
every checkpoint's, and the last one's extra decode, e.g. {"beam_width": 4,
"length_penalty": 0.6}), "label_smoothing"}.

RESULT: one record per checkpoint, from ONE forward pass over the dev split:
  dev_loss_opennmt  what `onmt-main eval` reports: the model's own compute_loss with
                    training=False, i.e. cross entropy WITHOUT label smoothing,
                    summed over target tokens (</s> included) / their number.
  dev_loss          t2t_lite's dev loss (t2t_lite/models/losses.py token_loss) on the
                    same logits: cross entropy against the label-smoothed target
                    (1 - ls at the label, ls / (V - 1) elsewhere) minus that
                    target's entropy, so 0 is the best score. This is the number
                    bench_recipes' dev loss column holds.
  greedy_file       beam_width 1 translations of bleu_source (pieces, one a line);
  beam_file         the last checkpoint's, with "beam" (pieces).
"""

import copy
import json
import math
import os
import sys

import opennmt
import tensorflow as tf


def loss_function(model, label_smoothing):
    """A function of a dev batch: (OpenNMT's loss sum, t2t_lite's loss sum, target
    tokens), both losses from the same logits."""
    vocab = model.labels_inputter.vocabulary_size  # the softmax's width
    confidence, low = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    entropy = -(confidence * math.log(confidence) + (vocab - 1) * low * math.log(low))

    @tf.function(reduce_retracing=True)
    def sums(features, labels):
        outputs, _ = model(features, labels=labels, training=False)
        onmt_sum, _, tokens = model.compute_loss(outputs, labels, training=False)
        logits = tf.cast(outputs["logits"], tf.float32)  # [batch, time, vocab]
        log_p = tf.nn.log_softmax(logits)
        nll = -tf.gather(log_p, labels["ids_out"], batch_dims=2)  # [batch, time]
        # -sum_v q_v log p_v: confidence at the label, `low` at the other ids.
        smoothed = confidence * nll - low * (tf.reduce_sum(log_p, -1) + nll)
        mask = tf.sequence_mask(labels["length"], tf.shape(logits)[1], tf.float32)
        return onmt_sum, tf.reduce_sum((smoothed - entropy) * mask), tokens

    return sums


def loss_sums(sums, dataset):
    """The three sums of `loss_function` over the whole dataset."""
    totals = [0.0, 0.0, 0.0]
    for features, labels in dataset:
        totals = [a + float(b) for a, b in zip(totals, sums(features, labels))]
    return totals


def main(spec_path, result_path):
    with open(spec_path) as f:
        spec = json.load(f)
    model_fn = opennmt.config.load_model_from_file(spec["model_file"], as_builder=True)
    model = model_fn()
    config = opennmt.config.merge_config(
        model.auto_config(), copy.deepcopy(spec["config"])
    )
    model.initialize(config["data"], params=config["params"])
    weights = tf.train.Checkpoint(model=model)  # what weights_only restores
    dataset = model.examples_inputter.make_evaluation_dataset(
        spec["dev_source"], spec["dev_target"], 32, length_bucket_width=5
    )
    sums = loss_function(model, spec["label_smoothing"])
    runners = {
        name: opennmt.Runner(model_fn, _params(spec, name), auto_config=True)
        for name in ("greedy", "beam")
    }
    records = []
    for index, path in enumerate(spec["checkpoints"]):
        weights.restore(path).expect_partial()
        onmt_sum, t2t_sum, tokens = loss_sums(sums, dataset)
        record = {
            "checkpoint": path,
            "dev_loss_opennmt": onmt_sum / tokens,
            "dev_loss": t2t_sum / tokens,
            "dev_tokens": int(tokens),
        }
        for name, runner in runners.items():
            if name == "beam" and index < len(spec["checkpoints"]) - 1:
                continue
            out = os.path.join(spec["output_dir"], f"{name}-{index + 1}.txt")
            runner.infer(spec["bleu_source"], out, checkpoint_path=path)
            record[f"{name}_file"] = out
        records.append(record)
    with open(result_path, "w") as f:
        json.dump(records, f, indent=1)


def _params(spec, decode):
    """The config with the decoding params spec[decode]."""
    config = copy.deepcopy(spec["config"])
    config.setdefault("params", {}).update(spec[decode])
    return config


if __name__ == "__main__":
    main(*sys.argv[1:3])
