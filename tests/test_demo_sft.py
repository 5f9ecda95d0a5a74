"""SFT of the demo base policy: the loss goes down, pairs are encoded as prompt + answer + <|im_end|>."""

import numpy as np
import pytest

from jaxrl.demo import domain, prompt, sft
from jaxrl.demo.policy import new_policy, policy_config
from jaxrl.demo.tokenizer import DemoTokenizer


def test_pairs_mask_exactly_the_answer_and_eos():
    tok = DemoTokenizer()
    samples = domain.generate(0, 6, "sft-test")
    pairs, _ = sft.sft_pairs(samples, 0.5, 0)
    tokens, mask = sft.encode_pairs(tok, pairs)
    for row, m, (messages, answer) in zip(tokens, mask, pairs):
        n_prompt = len(tok.encode(tok.render_chat(messages)))
        answered = row[m > 0]
        assert tok.decode(answered) == answer + "<|im_end|>"
        assert m[:n_prompt].sum() == 0 and (row[n_prompt + len(answered):] == tok.pad_id).all()


def test_rewrite_share_sets_the_share_of_over_editing_targets():
    samples = domain.generate(1, 400, "sft-share")
    pairs, shares = sft.sft_pairs(samples, 1.0, 0)
    could = np.mean([s.rewrite() != s.task.solution for s in samples])
    assert shares["overedit"] == could and could > 0.5 and shares["rewrite"] == 1.0
    assert sft.sft_pairs(samples, 0.0, 0)[1]["overedit"] == 0.0
    pairs, _ = sft.sft_pairs(samples, 0.0, 0)
    assert all(answer == prompt.answer(s.task.solution) for (_, answer), s in zip(pairs, samples))


def test_miss_share_keeps_the_buggy_code_in_that_share_of_minimal_targets():
    samples = domain.generate(1, 1000, "sft-miss")
    pairs, shares = sft.sft_pairs(samples, 0.5, 0, miss_share=0.2)
    kinds = []
    for (_, answer), s in zip(pairs, samples):
        kind = {prompt.answer(s.rewrite()): "rewrite", prompt.answer(s.task.buggy_code): "miss",
                prompt.answer(s.task.solution): "fix"}
        kinds.append(kind.get(answer))
    # A rewrite of a program without swapped correct lines is also its fix, so count by the returned shares.
    assert None not in kinds and shares["miss"] == kinds.count("miss") / len(kinds)
    assert abs(shares["rewrite"] - 0.5) < 0.05 and abs(shares["miss"] - 0.5 * 0.2) < 0.03
    assert shares["rewrite"] + shares["fix"] + shares["miss"] == pytest.approx(1.0)


def test_sft_lowers_the_loss():
    tok = DemoTokenizer()
    pairs, _ = sft.sft_pairs(domain.generate(2, 64, "sft-loss"), 0.5, 0)
    tokens, mask = sft.encode_pairs(tok, pairs)
    model = new_policy(policy_config(tok, hidden=32, layers=1, heads=2), 0)
    losses = sft.train_sft(model, tokens, mask, sft.SFTConfig(steps=30, batch_size=16, learning_rate=1e-2,
                                                              warmup_steps=3), seed=0)
    assert len(losses) == 30 and np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.6 * losses[0]


def test_splitting_the_batch_over_devices_does_not_change_training():
    import jax

    tok = DemoTokenizer()
    pairs, _ = sft.sft_pairs(domain.generate(3, 32, "sft-split"), 0.5, 0)
    tokens, mask = sft.encode_pairs(tok, pairs)
    cfg = sft.SFTConfig(steps=6, batch_size=8, learning_rate=1e-2, warmup_steps=1)
    runs = []
    for devices in (jax.devices()[:1], jax.devices()):
        model = new_policy(policy_config(tok, hidden=32, layers=1, heads=2), 0)
        losses = sft.train_sft(model, tokens, mask, cfg, seed=0, devices=devices)
        runs.append((losses, np.asarray(model.lm_head_weight())))
    assert len(jax.devices()) > 1 and sft.data_mesh(8).devices.size == min(8, len(jax.devices()))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-5)
    np.testing.assert_allclose(runs[0][1], runs[1][1], rtol=1e-4, atol=1e-6)
