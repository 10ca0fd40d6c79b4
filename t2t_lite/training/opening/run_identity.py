"""What a run directory records about the run that trains in it, so that a resume
continues the same run (outputs/run_files.py's check_run_identity refuses another)."""

import dataclasses


def run_identity(config, problem, hp, n, replicas, auto_batch):
    """The facts run.json keeps: problem, model, vocabulary, accumulation steps
    (n, or a batch-size schedule's micro-batch tokens over all replicas, in which
    a checkpoint's windows are sized) and the auto batch size's probe result."""
    identity = {
        "problem": config.problem,
        "model": config.model,
        "vocab_fingerprint": problem.vocab_fingerprint(),
        "accumulate_steps": n or "batch_size_schedule",
    }
    if not n:
        identity["micro_batch_tokens"] = hp.batch_size * replicas
    if auto_batch is not None:
        identity["auto_batch"] = dataclasses.asdict(auto_batch)
    return identity


def identity_hints(hp, replicas):
    """What the error says when n changed on resume: only effective_batch_size and
    batch_size_schedule make it depend on the replica count (n itself is an hparam,
    guarded with the others)."""
    if hp.effective_batch_size > 0:
        setting = f"effective_batch_size {hp.effective_batch_size}"
    elif hp.batch_size_schedule:
        setting = f"batch_size_schedule {hp.batch_size_schedule}"
    else:
        return {}
    hint = (
        f" ({setting} on {replicas} replica(s) of batch_size {hp.batch_size}); "
        "resume on the replica count it was trained on, or use a new output_dir."
    )
    return {"accumulate_steps": hint, "micro_batch_tokens": hint}
