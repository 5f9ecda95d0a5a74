"""Sampled completions → the train step's `Batch` rows, exactly as they were sampled.

Row layout, one per rollout, `T = prompt_len + max_tokens` columns:

    [pad … pad | prompt | completion | pad … pad]
     segment 0   segment 1 ─────────   segment 0

Segment ids mark the real tokens, so the update attends only within
prompt + completion and positions restart at 0 on the first prompt token: the
same context and positions the sampler used with its left-padded prompts (without
them the update would attend to padding and its log-probs would drift from the
sampler's). The loss mask covers the tokens the policy chose: completion tokens
the engine appended (the thinking budget's `</think>`) are not trained on.
Log-probs follow `jaxrl.losses`: `old_logp[b, t]` belongs to token t.

All arrays are NumPy, host-local; `to_global` assembles them into global arrays
sharded over the mesh (each host passing its own rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxrl.rollout import Completion
from jaxrl.train_step import Batch


def pad_length(n: int, multiple: int = 64) -> int:
    """`n` rounded up to a multiple (fewer distinct shapes, fewer compiles)."""
    return -(-n // multiple) * multiple


def rollout_rows(prompts: Sequence[Sequence[int]], groups: Sequence[Sequence[Completion]], prompt_len: int,
                 max_tokens: int, pad_id: int) -> dict[str, np.ndarray]:
    """NumPy rows (tokens, segment ids, loss mask, old log-probs) of N prompts × G completions.

    Rows are prompt-major: row n·G + g is completion g of prompt n.
    """
    rows = [(p, c) for p, group in zip(prompts, groups) for c in group]
    t = prompt_len + max_tokens
    tokens = np.full((len(rows), t), pad_id, np.int32)
    seg = np.zeros((len(rows), t), np.int32)
    mask = np.zeros((len(rows), t), np.int32)
    logp = np.zeros((len(rows), t), np.float32)
    for r, (prompt, c) in enumerate(rows):
        if len(prompt) > prompt_len:
            raise ValueError(f"a prompt of {len(prompt)} tokens exceeds the batch's prompt length {prompt_len}")
        if len(c.token_ids) > max_tokens:
            raise ValueError(f"a completion of {len(c.token_ids)} tokens exceeds max_tokens={max_tokens}")
        start = prompt_len - len(prompt)
        end = prompt_len + len(c.token_ids)
        tokens[r, start:prompt_len] = prompt
        tokens[r, prompt_len:end] = c.token_ids
        seg[r, start:end] = 1
        forced = np.asarray(c.forced, bool) if c.forced else np.zeros(len(c.token_ids), bool)
        mask[r, prompt_len:end] = ~forced
        logp[r, prompt_len:end] = c.logprobs
    return {"tokens": tokens, "segment_ids": seg, "loss_mask": mask, "old_logp": logp}


def make_batch(rows: dict[str, np.ndarray], advantages_B: np.ndarray, ref_logp: np.ndarray | None = None) -> Batch:
    """A host-local `Batch` of NumPy arrays (one advantage per row)."""
    return Batch(tokens_BxT=rows["tokens"], loss_mask_BxT=rows["loss_mask"], old_logp_BxT=rows["old_logp"],
                 advantages_BxS=np.asarray(advantages_B, np.float32)[:, None], ref_logp_BxT=ref_logp,
                 segment_ids_BxT=rows["segment_ids"])


def to_global(local: Batch, shardings: Batch) -> Batch:
    """Global arrays from every host's rows (hosts in process order make up the rows)."""
    count = jax.process_count()

    def one(x, s):
        return jax.make_array_from_process_local_data(s, x, (x.shape[0] * count, *x.shape[1:]))

    return jax.tree.map(one, local, shardings)
