"""`--warm_start_from`: start a new run from another run's model weights.

Fine-tuning and domain adaptation want the weights and nothing else: the optimizer
slots, the counters (global_step, update_step), the accumulators, the loss scale and
the input position of the old run would make the new run resume the old one rather
than start. So only variables under the checkpoint's `model/` are read.

What a user expects when the two models differ (T2T's and TF's warm start, OpenNMT's
`--checkpoint_path` for fine-tuning):
- a variable of the new model that the checkpoint lacks (a new layer) keeps its fresh
  initialization, and ALL such variables are named in one warning;
- a variable whose shape differs (another width, another vocabulary size) is refused
  with one line naming it: loading part of a tensor is never what was meant;
- a checkpoint of a run with another vocabulary (run.json's fingerprint) is refused:
  the same ids would mean other tokens.

Variables are matched by their object-graph path below `model` (e.g.
`model/encoder_layer_0/self_attention/q_dense/_kernel`); the fresh model's paths come
from writing its own model-only checkpoint once to a temporary directory, the only
public way to see its object graph.
"""

import json
import os
import tempfile

import tensorflow as tf
from absl import logging
from tensorflow.core.protobuf import trackable_object_graph_pb2

from t2t_lite.errors import UserError, first_line
from t2t_lite.outputs.checkpoints import checkpoint_prefix, checkpoints_on_disk


def resolve_checkpoint(path):
    """A run directory (its newest checkpoint), a checkpoint prefix, or one of its
    files (.index, .data-…) -> the checkpoint prefix; one-line error otherwise."""
    if os.path.isdir(path):
        found = checkpoints_on_disk(path)
        if not found:
            raise UserError(f"--warm_start_from '{path}' holds no checkpoint.")
        return found[-1][1]
    prefix = checkpoint_prefix(path)
    if not tf.io.gfile.exists(prefix + ".index"):
        raise UserError(
            f"--warm_start_from '{path}' is neither a run directory nor a checkpoint."
        )
    return prefix


def _model_shapes(prefix):
    """{path under model/: shape} of every variable reachable from the checkpoint's
    `model` object.

    Paths are walked in the saved object graph, breadth first from `model`: a
    training checkpoint names a weight's tensor after whichever object reached it
    first (often the optimizer), but the graph below `model` is the same in every
    checkpoint of the same model, so these paths compare across checkpoints.
    """
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    shapes = reader.get_variable_to_shape_map()
    roots = [c.node_id for c in graph.nodes[0].children if c.local_name == "model"]
    queue, seen, found = [(node, "model") for node in roots], set(roots), {}
    while queue:
        node_id, path = queue.pop(0)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                found[path] = shapes[attribute.checkpoint_key]
        for child in node.children:
            if child.node_id not in seen:
                seen.add(child.node_id)
                queue.append((child.node_id, f"{path}/{child.local_name}"))
    return found


def _check_vocabulary(prefix, vocab_fingerprint):
    """Refuses a source run whose run.json names another vocabulary."""
    run_json = os.path.join(os.path.dirname(prefix), "run.json")
    if not vocab_fingerprint or not os.path.exists(run_json):
        return
    try:
        with open(run_json) as f:
            theirs = json.load(f).get("vocab_fingerprint")
    except (OSError, ValueError, AttributeError):
        return
    if theirs and theirs != vocab_fingerprint:
        raise UserError(
            f"--warm_start_from '{prefix}' was trained with another vocabulary "
            f"({run_json}); its embeddings would map these ids to other tokens."
        )


def warm_start(model, path, vocab_fingerprint=None):
    """Loads the model weights of checkpoint/run `path` into `model` (built);
    returns the checkpoint prefix used. Raises UserError as the module says."""
    prefix = resolve_checkpoint(path)
    _check_vocabulary(prefix, vocab_fingerprint)
    try:
        theirs = _model_shapes(prefix)
    except (tf.errors.OpError, ValueError, KeyError) as e:
        raise UserError(f"--warm_start_from '{path}': {first_line(e)}") from None
    checkpoint = tf.train.Checkpoint(model=model)
    with tempfile.TemporaryDirectory() as tmp:
        ours = _model_shapes(checkpoint.write(os.path.join(tmp, "fresh")))
    misshaped = [k for k in ours if k in theirs and list(ours[k]) != list(theirs[k])]
    if misshaped:
        key = misshaped[0]
        raise UserError(
            f"--warm_start_from '{prefix}': {len(misshaped)} variable(s) have another "
            f"shape, e.g. {key} {list(theirs[key])} in the checkpoint vs "
            f"{list(ours[key])} here; warm-start from a model of the same shape."
        )
    missing = sorted(set(ours) - set(theirs))
    if len(missing) == len(ours):
        raise UserError(
            f"--warm_start_from '{prefix}' holds none of this model's variables "
            "(another model?)."
        )
    checkpoint.read(prefix).expect_partial()
    if missing:
        logging.warning(
            "Warm start from %s: %d variable(s) of this model are not in it and keep "
            "their initialization: %s.",
            prefix,
            len(missing),
            ", ".join(missing),
        )
    unused = len(set(theirs) - set(ours))
    logging.info(
        "Warm-started %d model variables from %s (%d of its model variables unused); "
        "optimizer, counters and accumulators start fresh.",
        len(ours) - len(missing),
        prefix,
        unused,
    )
    return prefix
