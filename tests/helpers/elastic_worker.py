"""A torchrun worker for tests/test_distributed.py: nmt-train, except that in the first attempt
(TORCHELASTIC_RESTART_COUNT=0) rank 1 kills itself with SIGKILL right after update $NMT_TEST_KILL_AT, as a lost
machine would. torchrun --max-restarts then starts every worker again, and resume=auto continues the run."""

import os
import signal
import sys

from nmt.cli import train
from nmt.training.trainer import Trainer

KILL_AT = int(os.environ.get("NMT_TEST_KILL_AT", "0"))

if KILL_AT and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and os.environ.get("RANK") == "1":
    after_update = Trainer._after_update

    def killed(self, progress):
        after_update(self, progress)
        if self.step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

    Trainer._after_update = killed

if __name__ == "__main__":
    from nmt.cli.common import run

    run(train.main, sys.argv[1:])
