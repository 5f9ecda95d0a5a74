"""Rollout engines behind one interface (`jaxrl.rollout.engine`)."""

from jaxrl.rollout.engine import ENGINES, Completion, Engine, SamplingParams, make_engine, register_engine

__all__ = ["ENGINES", "Completion", "Engine", "SamplingParams", "make_engine", "register_engine"]
