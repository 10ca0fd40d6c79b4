"""The Trainer under MirroredStrategy: resume mid-window, replica-count changes,
per-replica dropout, effective_batch_size (tests/support/distributed_trainer.py runs them in
one subprocess, which must split the CPU into logical devices before TF starts).

Apart from tests/test_distributed.py so that pytest-xdist's --dist loadfile can run
the two long subprocess fixtures on different workers.
"""

import pytest
from support.cli_helpers import run_json_script


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed_trainer")
    return run_json_script("distributed_trainer.py", str(root))


@pytest.mark.slow
def test_mid_window_stop_and_resume_equals_an_uninterrupted_run(trainer_runs):
    """2 replicas, n=3: SIGTERM after micro-step 4 (inside the second window), then
    resume; weights, slots and counters equal the uninterrupted run's."""
    assert trainer_runs["stopped_by"] == "SIGTERM"
    assert trainer_runs["stopped_at"] == 4
    assert trainer_runs["resume_micro_steps"] == 9
    assert trainer_runs["resume_updates"] == 3
    assert trainer_runs["resume_ratio"] < 1


@pytest.mark.slow
def test_a_save_gathers_the_replica_sums_at_once_and_writes_what_tf_would(
    trainer_runs,
):
    """The stopped run's accumulators hold a partial window. Its checkpoint, and
    another save through a CheckpointKeeper, hold bitwise what TF writes when it
    reads each replica-local variable itself; TF asks for at least one reduction
    per variable (across hosts, a collective each), a save for two in all."""
    assert trainer_runs["saved_tokens"] > 0
    assert trainer_runs["replica_sum_keys"] > 30
    assert trainer_runs["saved_differing"] == []
    assert trainer_runs["own_save_reductions"] >= trainer_runs["replica_sum_keys"]
    assert trainer_runs["save_reductions"] == 2


@pytest.mark.slow
def test_a_checkpoint_resumes_on_another_replica_count_with_a_warning(trainer_runs):
    warnings = trainer_runs["replica_change_warnings"]
    assert len(warnings) == 2
    assert "1 replica(s) on 2" in warnings[0] and "from 192 to 384" in warnings[0]
    assert "2 replica(s) on 1" in warnings[1] and "from 384 to 192" in warnings[1]
    # 1 update on one replica + 1 on two; 3 updates on two (9 micro-steps) + 1 on one.
    assert trainer_runs["grown_updates"] == 2 and trainer_runs["shrunk_updates"] == 4


@pytest.mark.slow
def test_replicas_draw_different_dropout_masks(trainer_runs):
    """Same batch on both replicas, dropout 0.5: different masks, different losses."""
    first, second = trainer_runs["dropout_replica_losses"]
    assert first != second


@pytest.mark.slow
def test_effective_batch_size_refuses_a_resume_that_would_change_n(trainer_runs):
    """192 tokens per update of 64-token micro-batches: n=3 on one replica, recorded
    in run.json; on 2 replicas n would be 2, and the resume is refused."""
    assert trainer_runs["effective_n"] == 3 == trainer_runs["effective_recorded_n"]
    assert trainer_runs["effective_updates"] == 1
    refusal = trainer_runs["effective_refusal"]
    assert refusal and "accumulate_steps 3, not 2" in refusal
    assert "effective_batch_size 192 on 2 replica(s)" in refusal and "\n" not in refusal
