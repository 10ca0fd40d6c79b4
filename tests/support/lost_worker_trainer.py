"""t2t-trainer that stops itself at a chosen point, so the lost-worker tests place a
worker's death exactly, without a kill hook in the library. Environment variables:

- KILL_AT_STEP=N: SIGKILL just before micro-step N (0-based: the step counter's value).
- FREEZE_AT_STEP=N: SIGSTOP just before micro-step N: the process stays alive with
  its sockets open but sends nothing, as a hung host does (the test kills it).
- KILL_IN_SAVE=N: SIGKILL on entering the save of checkpoint N, while the other
  workers are in theirs.
"""

import os
import signal

from t2t_lite.bin.trainer import run
from t2t_lite.outputs.checkpoints import CheckpointKeeper
from t2t_lite.training.step.train_step import TrainStep


def _step(name):
    return int(os.environ.get(name, "-1"))


_SIGNAL_AT = {
    _step("KILL_AT_STEP"): signal.SIGKILL,
    _step("FREEZE_AT_STEP"): signal.SIGSTOP,
}
_KILL_IN_SAVE = _step("KILL_IN_SAVE")
_train_on, _save = TrainStep.train_on, CheckpointKeeper.save


def _train_on_or_stop(self, batch, closes_window):
    sig = _SIGNAL_AT.get(int(self.micro_step))
    if sig is not None:
        os.kill(os.getpid(), sig)
    return _train_on(self, batch, closes_window)


def _save_or_die(self, number):
    if number == _KILL_IN_SAVE:
        os.kill(os.getpid(), signal.SIGKILL)
    return _save(self, number)


TrainStep.train_on = _train_on_or_stop
CheckpointKeeper.save = _save_or_die

if __name__ == "__main__":
    run()
