"""SFT of the demo base policy: the loss goes down, pairs are encoded as prompt + answer + <|im_end|>."""

import numpy as np

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
    pairs, over = sft.sft_pairs(samples, 1.0, 0)
    could = np.mean([s.rewrite() != s.task.solution for s in samples])
    assert over == could and over > 0.5
    assert sft.sft_pairs(samples, 0.0, 0)[1] == 0.0
    pairs, _ = sft.sft_pairs(samples, 0.0, 0)
    assert all(answer == prompt.answer(s.task.solution) for (_, answer), s in zip(pairs, samples))


def test_sft_lowers_the_loss():
    tok = DemoTokenizer()
    pairs, _ = sft.sft_pairs(domain.generate(2, 64, "sft-loss"), 0.5, 0)
    tokens, mask = sft.encode_pairs(tok, pairs)
    model = new_policy(policy_config(tok, hidden=32, layers=1, heads=2), 0)
    losses = sft.train_sft(model, tokens, mask, sft.SFTConfig(steps=30, batch_size=16, learning_rate=1e-2,
                                                              warmup_steps=3), seed=0)
    assert len(losses) == 30 and np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < 0.6 * losses[0]
