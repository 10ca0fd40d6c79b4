"""t2t-trainer with a fault placed at a chosen point, so the multi-host tests place a
worker's death or its out-of-memory exactly, without a fault hook in the library.
Environment variables (N is a micro-step, 0-based: the step counter's value):

- KILL_AT_STEP=N: SIGKILL just before micro-step N.
- FREEZE_AT_STEP=N: SIGSTOP just before micro-step N: the process stays alive with
  its sockets open but sends nothing, as a hung host does (the test kills it).
- KILL_IN_SAVE=N: SIGKILL on entering the save of checkpoint N, while the other
  workers are in theirs.
- OOM_AT_STEP=N: micro-step N's micro-batch runs out of memory (a simulated limit
  one token under its size, training/step/out_of_memory.py), on this worker only.
"""

import os
import signal

from t2t_lite.bin.trainer import run
from t2t_lite.outputs.checkpoints import CheckpointKeeper
from t2t_lite.training.step.out_of_memory import SimulatedMemory, padded_tokens
from t2t_lite.training.step.train_step import TrainStep


def _step(name):
    return int(os.environ.get(name, "-1"))


_SIGNAL_AT = {
    _step("KILL_AT_STEP"): signal.SIGKILL,
    _step("FREEZE_AT_STEP"): signal.SIGSTOP,
}
_KILL_IN_SAVE = _step("KILL_IN_SAVE")
_OOM_AT_STEP = _step("OOM_AT_STEP")
_train_on, _save = TrainStep.train_on, CheckpointKeeper.save


def _train_on_with_faults(self, batch, closes_window):
    step = int(self.micro_step)
    sig = _SIGNAL_AT.get(step)
    if sig is not None:
        os.kill(os.getpid(), sig)
    if step != _OOM_AT_STEP:
        return _train_on(self, batch, closes_window)
    self.simulated_memory = SimulatedMemory(padded_tokens(batch, self.strategy) - 1)
    try:
        return _train_on(self, batch, closes_window)
    finally:
        self.simulated_memory = None


def _save_or_die(self, number):
    if number == _KILL_IN_SAVE:
        os.kill(os.getpid(), signal.SIGKILL)
    return _save(self, number)


TrainStep.train_on = _train_on_with_faults
CheckpointKeeper.save = _save_or_die

if __name__ == "__main__":
    run()
