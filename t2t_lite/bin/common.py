"""What every CLI shares: one-line errors for user mistakes."""

import sys


def run_main(main, program):
    """Runs absl's app with `main`; a UserError becomes one line on stderr, exit 2."""
    from absl import app  # pylint: disable=g-import-not-at-top
    from t2t_lite.errors import UserError  # pylint: disable=g-import-not-at-top

    def guarded(argv):
        try:
            return main(argv)
        except UserError as e:
            print(f"{program}: error: {e}", file=sys.stderr)
            return 2

    app.run(guarded)
