"""The run configuration: frozen typed dataclasses per concern, loaded from YAML.

A run is described by one `Config` (model, data, rollout, reward, algorithm, loss,
optimizer, mesh, validation, run; `supervised` for a supervised baseline). It is read
from a YAML file, named (a file in `jaxrl/configs/` or the repository's `tpu_configs/`)
or given by path, then `--set a.b=value` overrides are applied:

    cfg = load_config("tiny", overrides=["run.steps=10", "rollout.group_size=4"])

Every value is checked against its field's type (an int where an int is asked, a
Literal's choices, ...); an unknown key or a wrong type raises `ConfigError` naming
the dotted key. Each section validates its own invariants in `__post_init__`.

A YAML file may start from another with `base: NAME_OR_PATH`: the base is loaded
first and the file's keys are merged over it (mappings key by key, other values
replaced). `to_yaml(cfg)` writes the fully resolved config, which loads back to an
equal `Config`; the trainer writes it into the run directory.

Every key is documented in docs/trainer.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from jaxrl import algorithms
from jaxrl.agent.env import DEFAULT_TURNS
from jaxrl.prompts import AGENT_PROMPTS
from jaxrl.sampling import Sampling
from reward.sandbox import DEFAULT_PRELOAD


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


# ---------------------------------------------------------------------------
# sections

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")



@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The policy: a Qwen family model from an HF checkpoint, or a random one of a given shape.

    Attributes:
        family: "qwen3" (dense) or "qwen3_5" (Qwen3.5/3.6 hybrid); also picks the tokenizer.
            Their mixtures of experts are the same families (`architecture.model_type`
            `qwen3_moe` or `qwen3_5_moe_text`).
        checkpoint: an HF safetensors directory (config.json + weights).
        architecture: an inline HF config.json dict for a randomly initialised model
            (exactly one of `checkpoint` and `architecture`); `model_type` defaults to `family`.
        init_seed: seed of the random initialisation.
        dtype: compute dtype.
        param_dtype: parameter (and optimizer state) dtype.
        remat: recompute each layer's activations in the backward pass.
        attention: the attention kernel of cache-free calls (training, scoring): "xla" (the
            einsum-softmax path of `models.layers`, any platform), "splash" (Pallas splash
            attention, TPU) or "cudnn" (`jax.nn.dot_product_attention` with cuDNN, NVIDIA GPU);
            see `models.fused_attention`. Decoding with a KV cache always uses "xla".
    """

    family: Literal["qwen3", "qwen3_5"] = "qwen3"
    checkpoint: str | None = None
    architecture: Mapping[str, Any] | None = None
    init_seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    remat: bool = True
    attention: Literal["xla", "splash", "cudnn"] = "xla"

    def __post_init__(self):
        if (self.checkpoint is None) == (self.architecture is None):
            raise ValueError("give exactly one of model.checkpoint and model.architecture")
        if self.architecture is not None:
            model_type = self.architecture.get("model_type", self.family)
            if model_type not in (self.family, f"{self.family}_text", f"{self.family}_moe", f"{self.family}_moe_text"):
                raise ValueError(f"model.architecture has model_type {model_type!r} but model.family is "
                                 f"{self.family!r}")


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """Tasks built on the fly by `precisecoder data build` (HumanEval), cached in `cache_dir`.

    Attributes:
        source: the built-in problem source.
        problems: use the first P problems of the source (None: all).
        seed: the build's seed (mutants, composites, splits).
        max_per_operator: single-fault candidates per operator and problem.
        cache_dir: where the built files live; a build with the same spec is reused.
    """

    source: Literal["humaneval"] = "humaneval"
    problems: int | None = None
    seed: int = 0
    max_per_operator: int = 4
    cache_dir: str = "~/.cache/precisecoder/tasks"

    def __post_init__(self):
        if self.problems is not None and self.problems < 1:
            raise ValueError(f"data.build.problems must be >= 1, got {self.problems}")
        if self.max_per_operator < 0:
            raise ValueError(f"data.build.max_per_operator must be >= 0, got {self.max_per_operator}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the tasks come from and how many a step takes.

    Attributes:
        train, val, gt_debug: task JSONL files (the schema of docs/data.md). With `build`,
            an unset one is taken from the built set (train.jsonl, val.jsonl, gt_debug.jsonl).
        build: build the task set on the fly instead of (or besides) files.
        tasks_per_step: N, the tasks of one RL step (each gets G rollouts).
        prompt: the prompt template (`jaxrl.prompts`): the paper's, or `demo` for `precisecoder demo`.
        seed: seeds the shuffle of the training tasks (each epoch reshuffled).
        clean_share: share of clean rows (a training problem's correct program shown as
            buggy code) mixed into the training tasks; "GRPO + clean rows" uses it.
        prompt_multiple: the prompt part of every batch row is the longest training
            prompt rounded up to a multiple of this (one shape per run either way; 64 keeps
            accelerator-friendly shapes, a small value saves padding on CPU).
    """

    train: str | None = None
    val: str | None = None
    gt_debug: str | None = None
    build: BuildSpec | None = None
    tasks_per_step: int = 32
    prompt: Literal["minimal", "abstain", "demo"] = "minimal"
    seed: int = 0
    clean_share: float = 0.0
    prompt_multiple: int = 64

    def __post_init__(self):
        if self.train is None and self.build is None:
            raise ValueError("give data.train (a task JSONL) or data.build")
        if self.tasks_per_step < 1:
            raise ValueError(f"data.tasks_per_step must be >= 1, got {self.tasks_per_step}")
        if not 0 <= self.clean_share < 1:
            raise ValueError(f"data.clean_share must be in [0, 1), got {self.clean_share}")
        if self.prompt_multiple < 1:
            raise ValueError(f"data.prompt_multiple must be >= 1, got {self.prompt_multiple}")


# Engines that cannot train: they do not return the sampled tokens' log-probs under the policy.
NOT_FOR_TRAINING = {"openai": "an OpenAI-compatible API returns no log-probs of the policy being trained"}


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Multi-turn rollouts (`rollout.agent`): each of a task's G rollouts is an episode of the
    five-turn tool loop (`jaxrl.agent`); every turn samples with the rollout's settings
    (`max_tokens` and `thinking_budget` are per turn).

    Attributes:
        turns: the turn budget of an episode.
        max_context: tokens of a whole episode (first prompt, replies, observations): the
            update's row length, at most the model's context. An episode whose next turn
            might not fit ends before it (`ended_by: context`).
        prompt: the agent prompt (`jaxrl.prompts.AGENT_PROMPTS`): the paper's `agent`, or
            `demo_agent` for `precisecoder demo --agent`'s policy.
    """

    turns: int = DEFAULT_TURNS
    max_context: int = 16384
    prompt: str = "agent"

    def __post_init__(self):
        if self.turns < 1:
            raise ValueError(f"rollout.agent.turns must be >= 1, got {self.turns}")
        if self.max_context < 2:
            raise ValueError(f"rollout.agent.max_context must be >= 2, got {self.max_context}")
        if self.prompt not in AGENT_PROMPTS:
            raise ValueError(f"rollout.agent.prompt must be one of {', '.join(AGENT_PROMPTS)}, got {self.prompt!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Sampling):
    """How completions are sampled: the sampling settings of `jaxrl.sampling.Sampling` (temperature,
    top_p, top_k, max_tokens, thinking_budget; the paper's by default), plus:

    Attributes:
        engine: a registered engine name (`jax`, `sglang`, ...).
        group_size: G, rollouts per task.
        options: engine-specific keyword arguments (e.g. SGLang `urls`, a memory share).
        agent: multi-turn episodes instead of single completions (None: single-turn).
    """

    engine: str = "jax"
    group_size: int = 6
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    agent: AgentConfig | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.engine in NOT_FOR_TRAINING:
            raise ValueError(f"rollout.engine: {self.engine} cannot train ({NOT_FOR_TRAINING[self.engine]}); "
                             "use jax or sglang")
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.thinking_budget is not None and self.thinking_budget > self.max_tokens:
            raise ValueError(f"rollout.thinking_budget must be in [0, max_tokens], got {self.thinking_budget}")
        if self.agent is not None and self.agent.max_context <= self.max_tokens:
            raise ValueError(f"rollout.agent.max_context ({self.agent.max_context}) must exceed rollout.max_tokens "
                             f"({self.max_tokens}), one turn's tokens")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """The PreciseCoder reward and the verification fleet that computes it.

    Attributes:
        lam: λ, the weight of the f1 term (r_λ = (1 − λ)·unit + λ·f1).
        epsilon: ε of the per-component cap (a task's own epsilon wins).
        workers: sandbox workers of this host's fleet (None: the host's CPU count).
        timeout_s: wall-clock limit of one test run (a task's own timeout wins).
        isolation: "auto" (bubblewrap, else rlimits with a warning), "bwrap" or "rlimits".
        sandbox_env: the Python environment (a venv or prefix) whose packages sandboxed runs may import,
            read-only (None: the one precisecoder runs in; "none": the standard library only). Its
            Python must be this host's version (docs/sandbox.md, "Library environments").
        preload: modules the sandbox servers import before they fork, shared by every run (those the
            environment lacks are skipped).
        threads: concurrent scorer calls in the reward pipeline (None: the workers).
        stream: score each task's group as soon as the engine has finished its samples, while it
            decodes the others (the same scores as scoring them all after decoding).
        window_batch: most windows of one prediction the scorer runs in one round (None: twice the
            workers). Rounds of many predictions keep the workers busy at 1, which runs no window
            after a component's first pass; the scores never depend on it.
        defer_verification: for algorithms whose reward terms need only the unit runs (GRPO,
            Dr.GRPO, RLOO, EA-GRPO, GRPO + clean rows), make the verification runs, which only the
            step's metrics read (precision, recall, F1), while the update runs instead of before it.
            The advantages, the update and the metrics are the same either way. Off by default: it
            pays only where the host's CPUs are free during the update (an accelerator's update);
            on a 2-core CPU machine the runs compete with the update and GRPO's steps got slower.
    """

    lam: float = 1 / 3
    epsilon: int = 1
    workers: int | None = None
    timeout_s: float = 5.0
    isolation: Literal["auto", "bwrap", "rlimits"] = "auto"
    sandbox_env: str | None = None
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    threads: int | None = None
    stream: bool = True
    window_batch: int | None = 1
    defer_verification: bool = False

    def __post_init__(self):
        if not 0 <= self.lam <= 1:
            raise ValueError(f"reward.lam must be in [0, 1], got {self.lam}")
        if self.epsilon < 0:
            raise ValueError(f"reward.epsilon must be >= 0, got {self.epsilon}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"reward.workers must be >= 1, got {self.workers}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"reward.threads must be >= 1, got {self.threads}")
        if self.window_batch is not None and self.window_batch < 1:
            raise ValueError(f"reward.window_batch must be >= 1, got {self.window_batch}")
        if not self.timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be positive, got {self.timeout_s}")
        if not all(isinstance(m, str) and all(p.isidentifier() for p in m.split(".")) for m in self.preload):
            raise ValueError(f"reward.preload must be module names, got {self.preload!r}")


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """Which reward terms feed which advantage estimator (`jaxrl.algorithms`).

    Attributes:
        name: a registered algorithm (`jaxrl.algorithms.algorithm_names()`): precisecoder
            (GDPO over [unit, f1], weights [1 − λ, λ]), grpo / drgrpo / rloo (unit only),
            ea_grpo (unit with the edit-size penalty), grpo_f1sum (GRPO on r_λ),
            grpo_clean_rows (GRPO on unit, plus fewer edited lines on clean rows).
        estimator: replaces the algorithm's estimator: a registered one, or `module:function`
            imported from `sys.path` (the working directory included).
        terms: replaces its reward terms (registered names); then `weights` is required.
        weights: one weight per term (default: the algorithm's, from `reward.lam`).
        options: keyword options of the estimator (e.g. `eps`, `token_weighted`, `alpha`, `beta`).
    """

    name: str = "precisecoder"
    estimator: str | None = None
    terms: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None
    options: Mapping[str, float | int | bool | str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        algorithms.get_algorithm(self.name)


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The policy loss (defaults: verl's actor).

    Attributes:
        clip_low: ε_low, the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high, clipped above at 1 + ε_high (DAPO's clip-higher: 0.28).
        dual_clip: c > 1 caps the loss of negative-advantage tokens at −c·A; None disables.
        agg_mode: one of `AGG_MODES`.
        norm_constant: Dr.GRPO's constant L for `seq-mean-token-sum-norm` (default: T).
        kl_coef: weight of KL(π ‖ π_ref) in the loss; > 0 needs reference log-probs.
        kl_estimator: "k1" or "k3".
        temperature: sampling temperature; logits are divided by it.
        logp_chunk: positions per chunk of the log-prob computation.
        router_aux_coef: weight of the mixture-of-experts load-balancing loss
            (`models.moe.load_balancing_loss` over the completion tokens); MoE policies only.
            0 (default) for RL fine-tuning: a released router is already balanced, and the
            term pulls routing toward uniform whatever the reward says, changing the policy
            on every token; see docs/models.md.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    agg_mode: str = "token-mean"
    norm_constant: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    temperature: float = 1.0
    logp_chunk: int = 512
    router_aux_coef: float = 0.0

    def __post_init__(self):
        if self.router_aux_coef < 0:
            raise ValueError(f"router_aux_coef must be >= 0, got {self.router_aux_coef}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must exceed 1, got {self.dual_clip}")
        if self.agg_mode not in AGG_MODES:
            raise ValueError(f"agg_mode {self.agg_mode!r} not in {AGG_MODES}")
        if self.norm_constant is not None and self.norm_constant <= 0:
            raise ValueError(f"norm_constant must be positive, got {self.norm_constant}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"kl_estimator must be k1 or k3, got {self.kl_estimator!r}")
        if self.temperature <= 0 or self.logp_chunk <= 0:
            raise ValueError("temperature and logp_chunk must be positive")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm clipping; linear warmup, then constant or cosine decay.

    Attributes:
        learning_rate: peak learning rate.
        warmup_steps: the rate at step s < warmup_steps is lr · (s + 1) / warmup_steps.
        schedule: "constant" or "cosine" after warmup.
        total_steps: steps of warmup plus decay (needed by "cosine").
        min_lr_ratio: the cosine floor as a fraction of the peak.
        b1, b2, eps: Adam moments.
        weight_decay: decoupled decay, on every parameter like verl's actor.
        max_grad_norm: clip gradients to this global norm.
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0

    def __post_init__(self):
        if self.learning_rate <= 0 or self.max_grad_norm <= 0:
            raise ValueError("learning_rate and max_grad_norm must be positive")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be constant or cosine, got {self.schedule!r}")
        if self.schedule == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
            raise ValueError("a cosine schedule needs total_steps > warmup_steps")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh and the logical → mesh axis rules.

    Attributes:
        data, fsdp, tensor: mesh sizes over all devices of all hosts; one may be -1
            (the rest of the devices).
        expert: the `expert` axis (mixture-of-experts policies): splits the routed
            experts, and the batch like `data` elsewhere; 1 (default) for dense models.
        rules: logical axis → mesh axes, merged over `models.sharding.RULES`
            (`{embed: fsdp, mlp: [tensor], seq: null}`).
        strict: refuse (instead of warning) when a mesh axis does not divide the
            dimension it is asked to shard.
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    rules: Mapping[str, tuple[str, ...] | str | None] = dataclasses.field(default_factory=dict)
    strict: bool = False
    expert: int = 1

    def __post_init__(self):
        if self.expert < 1:
            raise ValueError(f"mesh.expert must be >= 1, got {self.expert}")
        sizes = (self.data, self.fsdp, self.tensor)
        if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
            raise ValueError(f"mesh sizes must be positive with at most one -1, got {sizes}")
        for name, axes in self.rules.items():
            axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
            bad = set(axes) - {"data", "fsdp", "expert", "tensor"}
            if bad:
                raise ValueError(f"mesh.rules.{name} names unknown mesh axes {sorted(bad)}")


@dataclasses.dataclass(frozen=True)
class HardwareConfig:
    """The machine a preset is sized for; `precisecoder plan` checks the preset fits it.

    Attributes:
        platform: "tpu" or "gpu".
        accelerator: the chip, as a name for people ("TPU v5p", "NVIDIA H200").
        topology: a TPU slice's topology for ahead-of-time compilation (`v5p:2x2x4`,
            `v5e:4x4`; `jax.experimental.topologies`); None on GPUs.
        chips: accelerators the trainer's mesh spans (on a GPU node: the training GPUs).
        hosts: hosts of the slice or node (each runs the same command).
        hbm_gib: memory per chip in GiB.
        peak_tflops: dense bfloat16 peak per chip, for MFU.
        prompt_tokens: the longest prompt the plan budgets for; rows are prompt + max_tokens.
        rollout_gpus: GPUs of the node that serve SGLang instead of training (GPU presets).
        rollout_tensor_parallel: GPUs per SGLang server (its `--tp-size`), for the plan's memory estimate.
    """

    platform: Literal["tpu", "gpu"] = "tpu"
    accelerator: str = "TPU v5p"
    topology: str | None = None
    chips: int = 1
    hosts: int = 1
    hbm_gib: float = 95.0
    peak_tflops: float = 459.0
    prompt_tokens: int = 1024
    rollout_gpus: int = 0
    rollout_tensor_parallel: int = 1

    def __post_init__(self):
        if self.chips < 1 or self.hosts < 1 or self.prompt_tokens < 1 or self.rollout_gpus < 0:
            raise ValueError("hardware.chips, hosts and prompt_tokens must be >= 1, rollout_gpus >= 0")
        if self.rollout_tensor_parallel < 1:
            raise ValueError("hardware.rollout_tensor_parallel must be >= 1")
        if self.hbm_gib <= 0 or self.peak_tflops <= 0:
            raise ValueError("hardware.hbm_gib and peak_tflops must be positive")
        if self.platform == "tpu" and self.topology is None:
            raise ValueError("hardware.topology is required on TPU (e.g. v5p:2x2x4)")


@dataclasses.dataclass(frozen=True)
class ValidationConfig(Sampling):
    """Validation on the val split (pass, precision, recall, lines) and GT Debug (no-op, damage).

    It runs `precisecoder eval`'s protocol (`jaxrl.eval`): one sample per task by default,
    the run's prompt, thinking on. The sampling settings (`jaxrl.sampling.Sampling`) are
    those of the val split (the paper's 6,144 tokens with a 4,096-token thinking budget).

    Attributes:
        val_tasks, gt_debug_tasks: use the first T tasks of each file (None: all; 0: skip).
        samples: completions per task.
        gt_debug_thinking_budget: thinking budget on GT Debug (16,384); its total is this
            plus the val split's room for the answer (max_tokens − thinking_budget).
    """

    val_tasks: int | None = None
    gt_debug_tasks: int | None = None
    samples: int = 1
    gt_debug_thinking_budget: int | None = 16384

    def __post_init__(self):
        super().__post_init__()
        for name in ("val_tasks", "gt_debug_tasks"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"validation.{name} must be >= 0, got {getattr(self, name)}")
        if self.samples < 1:
            raise ValueError("validation.samples must be >= 1")
        if self.thinking_budget is not None and self.thinking_budget >= self.max_tokens:
            raise ValueError(f"validation.thinking_budget must leave room for an answer within max_tokens, "
                             f"got {self.thinking_budget} of {self.max_tokens}")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The loop: how long, how often to validate and save, where to write.

    Attributes:
        steps: RL steps in all (a resumed run continues up to this).
        micro_batches: gradient-accumulation micro-batches of one update.
        eval_every: validate every k steps (0: never, except at the end).
        save_every: checkpoint every k steps (the last step is always saved).
        keep_last: checkpoints kept besides the best one.
        best_metric: a validation metric (e.g. `val/pass`) whose best checkpoint is kept; None: none.
        best_mode: "max" or "min" for `best_metric`.
        out: the run directory.
        seed: seeds the initialisation's RNG stream of sampling.
        progress: show a live progress display.
        tensorboard: write TensorBoard event files besides metrics.jsonl.
        exit_grace_s: after SIGINT or SIGTERM, the seconds the run has to save its last completed
            step and close before it exits regardless (a pod's preemption notice gives about 30 s
            on some clouds: set it below that there).
    """

    steps: int = 200
    micro_batches: int = 1
    eval_every: int = 25
    save_every: int = 25
    keep_last: int = 3
    best_metric: str | None = "val/pass"
    best_mode: Literal["max", "min"] = "max"
    out: str = "runs/run"
    seed: int = 0
    progress: bool = True
    tensorboard: bool = True
    exit_grace_s: float = 60.0

    def __post_init__(self):
        if not self.exit_grace_s > 0:
            raise ValueError("run.exit_grace_s must be > 0")
        if self.steps < 1 or self.micro_batches < 1 or self.keep_last < 1:
            raise ValueError("run.steps, run.micro_batches and run.keep_last must be >= 1")
        if self.eval_every < 0 or self.save_every < 0:
            raise ValueError("run.eval_every and run.save_every must be >= 0")


@dataclasses.dataclass(frozen=True)
class SupervisedConfig:
    """A supervised baseline's objective and data (`precisecoder supervised`; jaxrl/supervised.py).

    The paper's settings are the named configs `rs_sft` (2 epochs, lr 5e-6), `dpo`
    (1 epoch, β = 0.1, lr 5e-7) and `recap_refiner` (6 epochs); the learning rate is
    `optimizer.learning_rate`.

    Attributes:
        objective: `sft` (token-level NLL on the response) or `dpo` (sigmoid loss).
        rows: the selected rows (JSONL; `precisecoder supervised --rows` gives it).
        tasks: the task JSONL the rows' `task_id`s name (their prompts); rows with
            `messages` need none.
        epochs: passes over the rows.
        batch_size: rows (DPO: pairs) per step.
        beta: DPO's β.
        steps: stop after this step (None: epochs × ⌊rows / batch_size⌋); a resumed run continues.
        seed: the data order.
    """

    objective: Literal["sft", "dpo"]
    rows: str | None = None
    tasks: str | None = None
    epochs: int = 1
    batch_size: int = 8
    beta: float = 0.1
    steps: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.objective not in ("sft", "dpo"):
            raise ValueError(f"objective must be sft or dpo, got {self.objective!r}")
        if self.epochs < 1 or self.batch_size < 1 or (self.steps is not None and self.steps < 1):
            raise ValueError("epochs, batch_size and steps must be >= 1")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise ValueError(f"beta must be > 0, got {self.beta}")



@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """One training run, every setting in one place; `model` and `data` have no defaults."""

    name: str = "run"
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    loss: LossConfig = LossConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    mesh: MeshConfig = MeshConfig()
    validation: ValidationConfig = ValidationConfig()
    run: RunConfig = RunConfig()
    hardware: HardwareConfig | None = None
    supervised: SupervisedConfig | None = None

    def __post_init__(self):
        a = self.algorithm
        algorithms.parts(a.name, a.terms, a.weights, self.reward.lam)
        if self.loss.temperature != self.rollout.temperature and self.rollout.temperature > 0:
            raise ValueError(f"loss.temperature ({self.loss.temperature}) must equal rollout.temperature "
                             f"({self.rollout.temperature}): the update scores tokens under the sampling distribution")


# ---------------------------------------------------------------------------
# typed construction from plain data


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """`value` checked (and converted where lossless) against the type hint `tp`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return from_dict(tp, value, f"{key}.")
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(f"{key}: may not be null")
        arms = [arm for arm in args if arm is not type(None)]
        if len(arms) == 1:  # an optional value: its own type's error says what is wrong
            return _coerce(arms[0], value, key)
        errors = []
        for arm in args:
            if arm is type(None):
                continue
            if dataclasses.is_dataclass(arm) and isinstance(value, Mapping):
                return _coerce(arm, value, key)  # its own error names the key inside it
            try:
                return _coerce(arm, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {' or '.join(_describe(a) for a in args)}, got {value!r}")
    if origin is Literal:
        if value not in args or isinstance(value, bool) != any(isinstance(a, bool) for a in args):
            raise ConfigError(f"{key}: expected one of {list(args)}, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-6 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (Mapping, dict) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        vt = args[1] if len(args) == 2 else Any
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{key}: keys must be strings, got {k!r}")
            out[k] = _coerce(vt, v, f"{key}.{k}")
        return out
    raise ConfigError(f"{key}: unsupported field type {tp}")


def from_dict(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from plain data, checking every key and type (defaults fill the rest)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]}; {prefix.rstrip('.') or 'the config'} takes: "
                          f"{', '.join(fields)}")
    missing = [name for name, f in fields.items() if name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing key {prefix}{missing[0]}")
    kwargs = {k: _coerce(hints[k], v, f"{prefix}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (ValueError, TypeError, KeyError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {e}") from None


def to_dict(cfg: Any) -> Any:
    """Plain YAML-able data of a config (tuples as lists)."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML; `load_config` of it gives an equal `Config`."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, width=100)


# ---------------------------------------------------------------------------
# files, names and overrides


def config_dirs() -> list[Path]:
    """Where named configs live: the package's `configs/`, then the repository's `tpu_configs/`."""
    here = Path(__file__).resolve().parent
    return [here / "configs", here.parent / "tpu_configs"]


def config_names() -> list[str]:
    """Names of the configs in `config_dirs()`."""
    return sorted({p.stem for d in config_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def resolve_path(name_or_path: str | os.PathLike) -> Path:
    """A config's file: an existing path, else `NAME.yaml` in `config_dirs()`."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    for d in config_dirs():
        if (d / f"{name_or_path}.yaml").is_file():
            return d / f"{name_or_path}.yaml"
    raise ConfigError(f"no config {str(name_or_path)!r}: not a file and not a named config "
                      f"(named: {', '.join(config_names()) or 'none'})")


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def read_yaml(name_or_path: str | os.PathLike, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The raw data of a config file with its `base:` chain merged in."""
    path = resolve_path(name_or_path).resolve()
    if path in _seen:
        raise ConfigError(f"config {path} is its own base")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: the top level must be a mapping")
    base = data.pop("base", None)
    if base is None:
        return dict(data)
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a config name or path, got {base!r}")
    base_path = Path(base).expanduser()
    if not base_path.is_absolute() and (path.parent / base_path).is_file():
        base = str(path.parent / base_path)
    return _merge(read_yaml(base, _seen + (path,)), data)


_OVERRIDE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)=(.*)$", re.S)


def apply_override(data: Mapping[str, Any], override: str) -> dict[str, Any]:
    """`data` with one `a.b.c=value` applied; the value is parsed as YAML (`1`, `true`, `null`, `[1, 2]`)."""
    m = _OVERRIDE.match(override)
    if not m:
        raise ConfigError(f"override {override!r} is not KEY=VALUE with a dotted KEY")
    keys, raw = m.group(1).split("."), m.group(2)
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: the value is not valid YAML "
                          f"({str(e).splitlines()[0]}); quote a string that looks like YAML") from None
    out = dict(data)
    node = out
    for i, k in enumerate(keys[:-1]):
        child = node.get(k)
        if child is None:
            child = {}
        elif not isinstance(child, Mapping):
            raise ConfigError(f"override {override!r}: {'.'.join(keys[:i + 1])} is not a section")
        node[k] = dict(child)
        node = node[k]
    node[keys[-1]] = value
    return out


def load_config(name_or_path: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                data: Mapping[str, Any] | None = None) -> Config:
    """A `Config` from a named or path YAML (or from `data`), with `key=value` overrides applied."""
    raw = read_yaml(name_or_path) if name_or_path is not None else dict(data or {})
    for o in overrides:
        raw = apply_override(raw, o)
    return from_dict(Config, raw)


def config_from_args(name_or_path: str, overrides: list[str], steps: int | None, out: str | None) -> Config:
    """The run's config: the file, then `--set` overrides, then `--steps` and `--out`."""
    raw = read_yaml(name_or_path)
    for o in overrides:
        raw = apply_override(raw, o)
    run = dict(raw.get("run") or {})
    if steps is not None:
        run["steps"] = steps
    if out is not None:
        run["out"] = out
    return from_dict(Config, {**raw, "run": run})
