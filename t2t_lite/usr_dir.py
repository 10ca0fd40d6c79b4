"""`--t2t_usr_dir`: import the user's own package so that it registers things.

T2T's contract, kept: the directory is a Python package (it holds `__init__.py`);
importing it runs the user's `@HPARAMS_SETS.register()`, `MODELS.add(...)`,
`PROBLEMS.add(...)`, `OPTIMIZERS.add(...)` and `schedule.register_factor` calls, so the
names exist before any flag naming them is looked up. Every CLI imports it the same way
(bin/common.py), which is what lets a run trained with a user model be decoded and
exported with the same flag.

Where T2T was hard to use: a directory that was not a package, or a bug in the user's
module, surfaced as a bare ImportError traceback from deep inside the trainer. Here
the first is a one-line error naming the directory, and the second names the file and
line of the user's code that failed.
"""

import importlib
import os
import sys
import traceback

from t2t_lite.errors import UserError


def import_usr_dir(usr_dir):
    """Imports the package at `usr_dir` (its parent goes on sys.path); returns it."""
    path = os.path.abspath(os.path.expanduser(usr_dir.rstrip("/\\")))
    if not os.path.isdir(path):
        state = "is not a directory" if os.path.exists(path) else "does not exist"
        raise UserError(f"--t2t_usr_dir '{usr_dir}' {state}.")
    if not os.path.isfile(os.path.join(path, "__init__.py")):
        raise UserError(
            f"--t2t_usr_dir '{usr_dir}' is not a Python package: it needs an "
            "__init__.py that imports the modules registering your names."
        )
    parent, name = os.path.split(path)
    if not name.isidentifier():
        raise UserError(
            f"--t2t_usr_dir '{usr_dir}': '{name}' is not a valid Python module name."
        )
    loaded = sys.modules.get(name)
    if loaded is not None:
        if (
            os.path.dirname(os.path.abspath(getattr(loaded, "__file__", "") or ""))
            == path
        ):
            return loaded  # already imported (a second CLI in the same process)
        raise UserError(
            f"--t2t_usr_dir '{usr_dir}': a module named '{name}' is already imported "
            f"from elsewhere ({getattr(loaded, '__file__', 'built in')}); rename the "
            "directory."
        )
    sys.path.insert(0, parent)
    try:
        return importlib.import_module(name)
    except UserError as e:  # e.g. a name registered twice
        raise UserError(f"--t2t_usr_dir '{usr_dir}': {e}") from None
    except Exception as e:  # noqa: BLE001 - the user's bug, located for them
        sys.modules.pop(name, None)
        raise UserError(
            f"--t2t_usr_dir '{usr_dir}' failed to import: {type(e).__name__}: "
            f"{str(e).strip().splitlines()[0] if str(e).strip() else ''} "
            f"({_user_frame(e, path)})"
        ) from None


def _user_frame(error, path):
    """'file.py:LINE' of the innermost traceback frame inside the user's dir."""
    frames = traceback.extract_tb(error.__traceback__)
    inside = [
        f for f in frames if os.path.abspath(f.filename).startswith(path + os.sep)
    ]
    frame = (inside or frames or [None])[-1]
    if frame is None:
        return "no traceback"
    return f"at {frame.filename}:{frame.lineno}"
