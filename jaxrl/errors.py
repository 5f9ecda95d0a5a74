"""The error of a training run that cannot start or continue (exit 2, one line)."""


class TrainError(RuntimeError):
    """A run that cannot start or continue; the message says why (and the run stays resumable)."""
