"""The paper's evaluation: `evaluate` (the code path of `precisecoder eval` and of the trainer's
validation), its settings and result, and the reports and figures built from summaries."""

from jaxrl.eval.evaluate import EvalError, EvalResult, Sample, evaluate, metrics_of
from jaxrl.eval.protocol import EvalSettings, task_kind

__all__ = ["EvalError", "EvalResult", "EvalSettings", "Sample", "evaluate", "metrics_of", "task_kind"]
