"""What the tests share: tiny models and batches (accumulation_helpers), the CLI
in-process (cli_helpers), an independent reference for windows of any size
(window_reference), and the scripts that run in a fresh process
(distributed_equivalence, distributed_trainer, batch_schedule_replicas,
faulty_trainer: `run_json_script` starts them as `python -m support.NAME`)."""
