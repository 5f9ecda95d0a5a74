"""Print our Qwen3's logit error against transformers on the parity tests' tiny models.

    python scripts/qwen3_parity.py

One row per variant of tests/hf_qwen3.py: the fp32 max |Δ logits|, and for
bf16 (weights and activations on both sides) ours against transformers' bf16
and both against the fp32 reference. docs/models.md quotes its output.
"""

from __future__ import annotations

import os
import sys
import tempfile

import jax.numpy as jnp
import numpy as np
import torch

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [root, os.path.join(root, "tests")]

import models  # noqa: E402
from hf_qwen3 import VARIANTS, hf_logits, make_hf  # noqa: E402
from transformers import Qwen3ForCausalLM  # noqa: E402


def main() -> int:
    print("| variant | max |logit| | fp32 max |Δ| | bf16 ours vs transformers bf16 | bf16 error vs fp32: ours / transformers |")
    for name, kw in VARIANTS.items():
        with tempfile.TemporaryDirectory() as d:
            hf = make_hf(d, **kw)
            ids = np.random.RandomState(0).randint(1, 128, (2, 13))
            ref = hf_logits(hf, ids)
            ours = np.asarray(models.from_pretrained(d)(jnp.asarray(ids)))
            hf_bf16 = hf_logits(Qwen3ForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval(), ids)
            ours_bf16 = np.asarray(models.from_pretrained(d, dtype=jnp.bfloat16)(jnp.asarray(ids)).astype(jnp.float32))
        d_bf16 = np.abs(ours_bf16 - hf_bf16).max()
        print(f"| {name} | {np.abs(ref).max():.2f} | {np.abs(ours - ref).max():.1e} | {d_bf16:.3f} "
              f"({d_bf16 / np.abs(hf_bf16).max():.1%}) | {np.abs(ours_bf16 - ref).max():.3f} / "
              f"{np.abs(hf_bf16 - ref).max():.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
