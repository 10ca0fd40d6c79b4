"""What every CLI shares: one-line errors for user mistakes, flags included."""

import sys

from absl import app, flags

from t2t_lite.errors import UserError, first_line
from t2t_lite.usr_dir import import_usr_dir

flags.DEFINE_string(
    "t2t_usr_dir",
    "",
    "A directory holding your Python package (with __init__.py); importing it "
    "registers your hparams sets, problems, models, optimizers and schedule factors "
    "(docs/extending.md).",
)


def define_flags(specs, module_name):
    """absl flags from declared options (training/opening/trainer_options.py's flag_specs()),
    registered as `module_name`'s own: the CLI that uses them owns them, as if it
    had defined each one itself."""
    if module_name == "__main__":  # `python -m`: absl names the main module by path
        module_name = sys.argv[0]
    define = {
        str: flags.DEFINE_string,
        int: flags.DEFINE_integer,
        float: flags.DEFINE_float,
        bool: flags.DEFINE_boolean,
    }
    for spec in specs:
        if spec.choices:
            flags.DEFINE_enum(
                spec.name,
                spec.default,
                list(spec.choices),
                spec.help,
                module_name=module_name,
            )
        else:
            define[spec.kind](
                spec.name, spec.default, spec.help, module_name=module_name
            )


def _error(program, message):
    print(f"{program}: error: {message}", file=sys.stderr)
    return 2


def run_main(main, program):
    """Runs absl's app with `main`.

    A UserError, or a flag absl cannot parse (unknown flag, `--train_steps=abc`,
    missing --flagfile), becomes one line "program: error: ..." on stderr and exit
    status 2, with no traceback; absl's own report would take two lines.
    """

    def parse_flags(argv):
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            sys.exit(_error(program, first_line(e)))

    def guarded(argv):
        try:
            if flags.FLAGS.t2t_usr_dir:
                import_usr_dir(flags.FLAGS.t2t_usr_dir)
            return main(argv)
        except UserError as e:
            return _error(program, e)
        except KeyboardInterrupt:  # a second Ctrl-C/SIGTERM: stop now, no traceback
            print(f"{program}: interrupted.", file=sys.stderr)
            return 130

    app.run(guarded, flags_parser=parse_flags)
