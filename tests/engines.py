"""Stand-in rollout engines for trainer tests (not shipped: the real ones live in jaxrl/rollout).

- `DecoderEngine` samples from the policy with `models.decode.Decoder` (left-padded
  prompts, a KV cache): real sampler log-probs, so the update is on-policy.
- `ScriptedEngine` returns fixed texts chosen from the task (no model), for tests
  that need completions independent of the device layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl.batching import pad_length
from jaxrl.rollout import Completion, Engine, SamplingParams, register_engine
from jaxrl.rollout.text import TokenSpec, make_completion, prompt_opens_think
from models import decode


class DecoderEngine(Engine):
    """Samples `params.n` completions per prompt from the current weights (no thinking budget)."""

    def __init__(self, model, tokenizer, mesh=None, rules=None, **_):
        self.tokenizer = tokenizer
        # A Qwen-like tokenizer's think block, else (a character tokenizer) only its stops.
        self.spec = (TokenSpec.from_tokenizer(tokenizer) if hasattr(tokenizer, "think_id")
                     else TokenSpec(stop_ids=tuple(tokenizer.stop_ids)))
        self.decoder = decode.Decoder(model)
        self.state = self.decoder.state
        self.updates = 0

    def generate(self, prompts, params: SamplingParams):
        rows = [list(p) for p in prompts for _ in range(params.n)]
        width = pad_length(max(len(r) for r in rows))
        ids = np.full((len(rows), width), self.tokenizer.pad_id, np.int32)
        mask = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = r
            mask[i, width - len(r):] = 1
        out = self.decoder.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=params.max_tokens,
                                    params=decode.SamplingParams(params.temperature, params.top_p, params.top_k),
                                    eos_ids=self.tokenizer.stop_ids, key=jax.random.key(params.seed),
                                    state=self.state)
        tokens, logps, lengths = (np.asarray(out[k]) for k in ("tokens", "logprobs", "lengths"))
        comps = []
        for i in range(len(rows)):
            n = int(lengths[i])
            tok = [int(t) for t in tokens[i, :n]]
            stop = n > 0 and tok[-1] in self.spec.stop_ids
            comps.append(make_completion(tok, logps[i, :n], (False,) * n, "stop" if stop else "length",
                                         prompt_opens_think(rows[i], self.spec), self.spec, self.tokenizer.decode))
        return [comps[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    def update_weights(self, model, *, step):
        self.state = nnx.state(model)
        self.updates += 1


class ScriptedEngine(Engine):
    """Completion g of a task: the reference fix in a python block (g even) or the buggy code (g odd).

    Every token gets log-prob `logprob` (a tiny random model's are near −log V).
    """

    def __init__(self, tokenizer, tasks_by_prompt, logprob=-12.0, **_):
        self.tokenizer = tokenizer
        self.tasks_by_prompt = tasks_by_prompt
        self.logprob = logprob

    def code(self, task, g):
        """The program of completion g of `task`."""
        return task.solution if g % 2 == 0 else task.buggy_code

    def generate(self, prompts, params: SamplingParams):
        out = []
        for p in prompts:
            task = self.tasks_by_prompt[tuple(p)]
            group = []
            for g in range(params.n):
                code = self.code(task, g)
                text = f"<think>\nok\n</think>\n\n```python\n{code}\n```"  # the stop token is in `tok` only
                tok = tuple(self.tokenizer.encode(text + "<|im_end|>"))[: params.max_tokens]
                group.append(Completion(tok, (self.logprob,) * len(tok), "stop", text, "ok", code,
                                        (False,) * len(tok)))
            out.append(group)
        return out

    def update_weights(self, model, *, step):
        pass


def _scripted_from_file(model, tokenizer, mesh=None, rules=None, tasks=None, prompt="minimal", logprob=-12.0,
                        cls=ScriptedEngine, **_):
    """`cls` (a `ScriptedEngine`) over the tasks of a JSONL file (`rollout.options.tasks`, `prompt`, `logprob`)."""
    from jaxrl.tasks import render
    from reward.schema import load_tasks

    by_prompt = {render(t, tokenizer, prompt).prompt_ids: t for t in load_tasks(tasks)}
    return cls(tokenizer, by_prompt, logprob)


@register_engine("test-decoder")
def _decoder(model, tokenizer, mesh=None, rules=None, **_):
    return DecoderEngine(model, tokenizer)
register_engine("test-scripted")(_scripted_from_file)


class BrokenEngine(Engine):
    """An engine whose server has gone away."""

    def __init__(self, **_):
        pass

    def generate(self, prompts, params):
        raise ConnectionError("server at 127.0.0.1:1 refused the connection")

    def update_weights(self, model, *, step):
        pass


register_engine("test-broken")(lambda **kw: BrokenEngine(**kw))
