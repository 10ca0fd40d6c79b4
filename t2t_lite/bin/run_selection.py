"""The flags that pick a trained run and its checkpoint, shared by t2t-decoder and
t2t-exporter (both rebuild the model from the run's hparams.json and run.json,
decoding/loading.py)."""

from absl import flags


def define_run_selection_flags(module_name, purpose):
    """Defines --output_dir, --checkpoint_path, --problem, --model, --hparams_set,
    --hparams and --data_dir as `module_name`'s own flags (each CLI owns its copy,
    as if it had defined them itself). purpose: "decode with", "export", ..."""
    define = {"module_name": module_name}
    flags.DEFINE_string(
        "output_dir", "", f"The run to {purpose} (its checkpoints).", **define
    )
    flags.DEFINE_string(
        "checkpoint_path",
        "",
        "A checkpoint prefix (RUN/model-N); default: the newest.",
        **define,
    )
    flags.DEFINE_string(
        "problem", "", "Problem; default: the run's (run.json).", **define
    )
    flags.DEFINE_string("model", "", "Model; default: the run's (run.json).", **define)
    flags.DEFINE_string("hparams_set", "", "Default: the run's hparams.json.", **define)
    flags.DEFINE_string(
        "hparams", "", "Must agree with the run's hparams.json.", **define
    )
    flags.DEFINE_string(
        "data_dir", "", "The problem's data dir (its vocabulary).", **define
    )


def run_selection(flag_values):
    """The run-selection flags' values, as decoding/loading.py's keyword arguments."""
    names = ("output_dir", "checkpoint_path", "problem", "model", "hparams_set")
    return {name: flag_values[name].value for name in names + ("hparams", "data_dir")}
