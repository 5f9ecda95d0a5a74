"""`precisecoder train` with the test engines registered (`test-decoder`, `test-scripted`); for subprocess tests.

Usage: python tests/train_runner.py [train arguments]. XLA_FLAGS from the caller's environment apply.
"""

import faulthandler
import os
import signal
import sys

faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` prints every thread's stack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engines  # noqa: E402,F401  (registers the test engines)

from jaxrl.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
