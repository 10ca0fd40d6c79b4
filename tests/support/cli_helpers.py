"""Running the CLIs in tests: in-process (fast) or as a subprocess (end to end).

Most CLI tests check flag and hparams validation, which needs no fresh interpreter:
`run_cli` runs a CLI's entry point (`t2t_lite.bin.<module>.run`, the function the
console script calls) in this process, with absl's global FLAGS parsed from the given
argv and reset afterwards. `start_cli`/`finish_cli`/`run_cli_subprocess` start
`python -m t2t_lite.bin.<module>` for the few true end-to-end runs (entry point, exit
status, signals), forked from the suite's fork server unless TensorFlow's start-up
is what they test (`fresh`).

Every CLI module defines its flags on absl's global FLAGS and several share names
(--problem, --output_dir, ...), so two of them cannot be imported side by side: the
in-process runner registers only the flags of the CLI it runs, putting the others'
aside until their CLI runs again.
"""

import contextlib
import dataclasses
import importlib
import io
import json
import os
import subprocess
import sys

from absl import flags
from absl import logging as absl_logging

from support import forked

PROGRAMS = {
    "trainer": "t2t-trainer",
    "datagen": "t2t-datagen",
    "decoder": "t2t-decoder",
    "avg_checkpoints": "t2t-avg-all",
    "bleu": "t2t-bleu",
    "exporter": "t2t-exporter",
    "plot": "t2t-plot",
}
_BIN = "t2t_lite.bin."
_PUT_ASIDE = {}  # CLI module name -> {flag name: Flag}, while another CLI runs


@dataclasses.dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def _cli_flags():
    """{flag name: (defining module, Flag)} of the flags defined in t2t_lite.bin's
    CLI modules (bin/common.py's, e.g. --t2t_usr_dir, belong to every CLI)."""
    result = {}
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith(_BIN) and module != _BIN + "common":  # shared by all
            for flag in module_flags:
                result[flag.name] = (module, flag)
    return result


def _activate(module_name):
    """Imports the CLI module with only its own flags registered on FLAGS."""
    for name, (module, flag) in _cli_flags().items():
        if module != module_name:
            _PUT_ASIDE.setdefault(module, {})[name] = flag
            delattr(flags.FLAGS, name)
    for flag in _PUT_ASIDE.pop(module_name, {}).values():
        flags.FLAGS[flag.name] = flag
        flags.FLAGS.register_flag_by_module(module_name, flag)
        flags.FLAGS.register_flag_by_module_id(id(sys.modules[module_name]), flag)
    return importlib.import_module(module_name)


@contextlib.contextmanager
def _captured_streams(stdin_text):
    """sys.stdin/stdout/stderr, and absl's log stream, swapped for strings."""
    out, err = io.StringIO(), io.StringIO()
    handler = absl_logging.get_absl_handler().python_handler
    saved = sys.stdin, sys.stdout, sys.stderr, handler.stream
    sys.stdin = io.StringIO(stdin_text or "")
    sys.stdout, sys.stderr, handler.stream = out, err, err  # logs: as a subprocess
    try:
        yield out, err
    finally:
        sys.stdin, sys.stdout, sys.stderr, handler.stream = saved


def run_cli(module, *args, stdin_text=None):
    """Runs t2t_lite.bin.`module`'s entry point in-process with argv `args`.

    Returns CliResult(exit status, stdout, stderr), stderr holding the log lines as
    a subprocess's would. FLAGS is parsed from this argv only and left unparsed, at
    its defaults, afterwards. An exception other than SystemExit (a bug, not a user
    error) propagates with its traceback.
    """
    module_name = _BIN + module
    cli = _activate(module_name)
    program = PROGRAMS[module]
    saved_argv, verbosity = sys.argv, absl_logging.get_verbosity()
    sys.argv = [program, *args]
    returncode = 0
    try:
        with _captured_streams(stdin_text) as (out, err):
            try:
                cli.run()
            except SystemExit as e:
                code = e.code
                returncode = code if isinstance(code, int) else (0 if not code else 1)
    finally:
        sys.argv = saved_argv
        flags.FLAGS.unparse_flags()
        absl_logging.set_verbosity(verbosity)
    return CliResult(returncode, out.getvalue(), err.getvalue())


def start_cli(module, *args, stdin_text=None, fresh=False):
    """Starts `python -m t2t_lite.bin.<module> args`, forked from the suite's fork
    server (support/forked.py), or a fresh Python with `fresh` (TensorFlow's
    start-up included: ~3 s, so start independent runs before finishing any)."""
    start = subprocess.Popen if fresh else forked.popen
    process = start(
        [sys.executable, "-m", _BIN + module, *args],
        stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, stdin_text


def finish_cli(started, timeout=300):
    """Waits for a `start_cli` process; returns CliResult."""
    process, stdin_text = started
    stdout, stderr = process.communicate(stdin_text, timeout=timeout)
    return CliResult(process.returncode, stdout, stderr)


def run_cli_subprocess(module, *args, stdin_text=None, timeout=300, fresh=False):
    """`python -m t2t_lite.bin.<module> args` to completion (see start_cli);
    returns CliResult."""
    started = start_cli(module, *args, stdin_text=stdin_text, fresh=fresh)
    return finish_cli(started, timeout)


def assert_one_error_line(stderr, program, *fragments):
    """stderr holds no traceback and exactly one line "PROGRAM: error: ...", which
    contains every fragment. Returns that line."""
    assert "Traceback" not in stderr, stderr[-2000:]
    prefix = f"{program}: error:"
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_user_error(result, program, *fragments):
    """A CLI run that refused a user mistake: exit status 2 and one error line."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    return assert_one_error_line(result.stderr, program, *fragments)


def tiny_trainer_flags(problem):
    """t2t-trainer flags for a few-step run of transformer_test on `problem`."""
    return [
        f"--problem={problem}",
        "--model=transformer",
        "--hparams_set=transformer_test",
        "--save_checkpoints_steps=4",
        "--local_eval_frequency=4",
        "--eval_steps=2",
        "--log_steps=2",
    ]


def run_json_script(name, *args, timeout=600):
    """Runs tests/support/NAME (a script that prints one JSON line last) in a process
    of its own (support/forked.py), as the module support.NAME from tests/ so that
    it imports its siblings as the tests do; returns that JSON. A failure shows the
    end of its stderr."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    module = "support." + os.path.splitext(name)[0]
    result = forked.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tests,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
