"""Training input for every local replica, checkpointed so a resume is exact.

TF 2.21's distributed iterators (`distribute_datasets_from_function`,
`experimental_distribute_dataset`) are not trackable: `tf.train.Checkpoint` refuses
them, so a resumed distributed run would start its data over. Here every local replica
has an ordinary tf.data iterator of its own (trackable: shuffle buffer and bucket
contents are saved with the model), and each micro-step hands the replicas their
batches through `experimental_distribute_values_from_function`. The cost against
`distribute_datasets_from_function` is measured by scripts/bench_distributed.py
(part 2: no measurable difference in full train steps).

Replica r of R (global index, all workers counted) reads shard r of R of the data
(files when the problem can shard by file, examples otherwise), shuffled with its own
seed, token-batched to `batch_size` tokens, repeated forever: no replica can run dry
and leave the others waiting in an all-reduce.
"""

from t2t_lite.errors import UserError
from t2t_lite.training.cluster.distribution import num_workers, worker_index


def iterator_name(replica):
    """Checkpoint key of global replica `replica`'s iterator. Replica 0 keeps the
    single-device name, so a one-device run's checkpoint resumes exactly."""
    return "train_iterator" if replica == 0 else f"train_iterator_{replica}"


class ReplicaInputs:
    """One checkpointable iterator per local replica; `next()` gives a micro-batch
    for each (a plain batch dict on one device, distributed values otherwise)."""

    def __init__(self, strategy, dataset_fn):
        """dataset_fn(replica, num_replicas) -> the dataset of global replica
        `replica` out of `num_replicas` (see the module docstring)."""
        self.strategy = strategy
        self.num_replicas = strategy.num_replicas_in_sync
        self.local_replicas = self.num_replicas // num_workers(strategy)
        self.first = worker_index(strategy) * self.local_replicas
        self.replicas = range(self.first, self.first + self.local_replicas)
        self.iterators = [iter(dataset_fn(r, self.num_replicas)) for r in self.replicas]

    def checkpoint_items(self):
        return {iterator_name(r): it for r, it in zip(self.replicas, self.iterators)}

    def next(self):
        batches = [_next_batch(it) for it in self.iterators]
        if self.num_replicas == 1:
            return batches[0]
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: batches[context.replica_id_in_sync_group - self.first]
        )


def _next_batch(iterator):
    try:
        return next(iterator)
    except StopIteration:
        raise UserError(
            "the training split produced no batches: are all examples longer "
            "than max_length?"
        ) from None
