"""t2t-trainer that SIGKILLs itself just before micro-step KILL_AT_STEP (an
environment variable): the lost-worker tests place a worker's death exactly,
without a kill hook in the library."""

import os
import signal

from t2t_lite.bin.trainer import run
from t2t_lite.training.train_step import TrainStep

_KILL_AT = int(os.environ.get("KILL_AT_STEP", "-1"))
_train_on = TrainStep.train_on


def _train_on_or_die(self, batch, closes_window):
    if int(self.micro_step) == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return _train_on(self, batch, closes_window)


TrainStep.train_on = _train_on_or_die

if __name__ == "__main__":
    run()
