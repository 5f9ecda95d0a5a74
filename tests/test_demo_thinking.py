"""The demo's thinking variant (`precisecoder demo --thinking`): traces, tokenizer, SFT pairs, and the
eval runs that `precisecoder transfer` and `analyze thinking` read."""

import json
import random

import pytest

from jaxrl import cli
from jaxrl.demo import domain, prompt, sft, thinking
from jaxrl.demo.tokenizer import DemoTokenizer, default_vocab, load_demo_tokenizer
from jaxrl.studies import lexical
from jaxrl.studies.thinking import bug_lines
from models.tokenizer import THINK_EMPTY

SAMPLES = domain.generate(5, 60, "thinking")


def test_a_fix_trace_names_the_buggy_line_and_its_comment_and_quotes_it_verbatim_or_not():
    rng = random.Random(0)
    quoted = 0
    for s in SAMPLES:
        text = thinking.trace(rng, s, "fix")
        n = s.bug_index + 2
        assert text.count(f"line {n}") == 2  # where the bug is, and what the fix changes
        assert s.program.lines[s.bug_index].words() in text
        quotes = lexical.quotes(text, s.task.buggy_code, bug_lines(s.task))
        assert list(quotes) == [n]  # the reference fix changes exactly the line the trace names
        quoted += quotes[n]
        assert (f"`{s.task.buggy_code.splitlines()[n - 1].strip()}`" in text) == quotes[n]
    assert 0.3 < quoted / len(SAMPLES) < 0.7  # half the traces quote the line


def test_the_other_kinds_say_what_their_answer_does_and_the_lexicons_find_their_phrases():
    rng = random.Random(1)
    lexicons = lexical.load_lexicons()
    rewrite = [thinking.trace(rng, s, "rewrite") for s in SAMPLES]
    assert all("rewrite" in t for t in rewrite)
    assert all("as it is" in t or "no change needed" in t for t in (thinking.trace(rng, s, "miss") for s in SAMPLES))
    fixes = " ".join(thinking.trace(rng, s, "fix") for s in SAMPLES)
    words = lexical.words(fixes)
    for name in ("hedging", "certainty", "verification", "minimality", "bug_assertion"):
        assert lexical.lexicon_rate(words, lexicons[name]) > 0, name
    assert lexical.lexicon_rate(lexical.words(" ".join(rewrite)), lexicons["rewriting"]) > 0
    with pytest.raises(ValueError, match="kind"):
        thinking.trace(rng, SAMPLES[0], "other")


def test_the_vocabulary_extends_the_demo_one_and_every_trace_fits_the_budget_as_whole_words():
    tok, base = thinking.thinking_tokenizer(), load_demo_tokenizer()
    assert tok.vocab[:base.vocab_size] == base.vocab and tok.vocab_size > base.vocab_size
    rng = random.Random(2)
    for s in SAMPLES:
        messages = prompt.task_messages(s.task)
        assert tok.encode(base.render_chat(messages)) == base.encode(base.render_chat(messages))
        for kind in ("fix", "rewrite", "miss"):
            text = thinking.trace(rng, s, kind)
            ids = tok.encode(text)
            assert tok.decode(ids) == text and len(ids) <= thinking.THINKING_BUDGET
            assert len(ids) < len(text) / 2.5  # words are tokens, not characters
    assert thinking.budgets(80, False) == {"max_tokens": 80, "thinking_budget": None}
    assert thinking.budgets(80, True) == {"max_tokens": 80 + thinking.THINKING_BUDGET,
                                          "thinking_budget": thinking.THINKING_BUDGET}


def test_the_thinking_prompt_leaves_the_block_open_and_the_tokenizer_saves_that(tmp_path):
    messages = prompt.task_messages(SAMPLES[0].task)
    tok = thinking.thinking_tokenizer()
    assert tok.render_chat(messages).endswith("<|im_start|>assistant\n<think>\n")
    assert tok.render_chat(messages, enable_thinking=False).endswith(THINK_EMPTY)
    assert tok.render_chat(messages, prefill="x").endswith("<think>\nx")
    assert load_demo_tokenizer().render_chat(messages, enable_thinking=True).endswith(THINK_EMPTY)
    tok.save_pretrained(tmp_path / "t")
    again = DemoTokenizer.from_pretrained(tmp_path / "t")
    assert again.thinking and again.vocab == tok.vocab
    load_demo_tokenizer().save_pretrained(tmp_path / "plain")  # the main demo's file: a plain list, as before
    assert json.loads((tmp_path / "plain" / "demo_vocab.json").read_text()) == list(default_vocab())
    assert not DemoTokenizer.from_pretrained(tmp_path / "plain").thinking


def test_thinking_sft_pairs_keep_the_targets_of_the_plain_ones():
    plain, shares = sft.sft_pairs(SAMPLES, 0.5, 3, 0.2)
    thought, shares_t = sft.sft_pairs(SAMPLES, 0.5, 3, 0.2, thinking=True)
    assert shares == shares_t
    for (m, answer), (m_t, completion) in zip(plain, thought):
        assert m == m_t
        think, answer_t = completion.split("\n</think>\n\n")
        assert answer_t == answer and think and "<think>" not in think


def test_the_base_evaluation_writes_thinking_that_analyze_thinking_reads(tmp_path, capsys):
    """A tiny thinking base (4 SFT steps) evaluated on 3 buggy and 1 clean task, then `analyze thinking`."""
    from jaxrl.demo.run import DemoConfig, evaluate_policy, make_data, train_base
    from jaxrl.eval.sources import tokenizer_of_model_dir
    from reward.fleet import Fleet
    from reward.schema import write_tasks
    import models

    cfg = DemoConfig(sft_tasks=16, train_tasks=1, test_tasks=3, clean_tasks=1, hidden=32, layers=1, heads=2,
                     sft=sft.SFTConfig(steps=4, batch_size=8, warmup_steps=1), thinking=True)
    splits = make_data(cfg, 0, tmp_path / "data")
    train_base(cfg, 0, splits, tmp_path / "base", progress=False)
    tok = tokenizer_of_model_dir(tmp_path / "base")  # what `precisecoder transfer --model` would load
    assert isinstance(tok, DemoTokenizer) and tok.thinking and tok.vocab == thinking.thinking_vocab()
    held_out = [s.task for s in splits.test + splits.clean]
    with Fleet(workers=1) as fleet:
        evaluate_policy(models.from_pretrained(tmp_path / "base"), cfg, 0, held_out, fleet,
                        tmp_path / "eval" / "base", False, samples=2, decodings={"sampled": 1.0})
    records = [json.loads(line) for line in (tmp_path / "eval" / "base" / "sampled" / "predictions.jsonl").open()]
    assert len(records) == 2 * len(held_out)
    assert all(r["think_opened"] and "thinking" in r for r in records)
    traced = sum(bool(r["thinking"] and r["thinking"].strip()) for r in records)
    assert traced > 0  # an untrained policy may close the block at once; most do not
    summary = json.loads((tmp_path / "eval" / "base" / "sampled" / "summary.json").read_text())
    assert summary["settings"]["enable_thinking"] and summary["settings"]["thinking_budget"] == 64
    assert summary["model"]["name"] == "base"  # the run's name in `analyze thinking` and `transfer compare`
    write_tasks(tmp_path / "heldout.jsonl", held_out)
    capsys.readouterr()
    assert cli.main(["analyze", "thinking", str(tmp_path / "eval" / "base" / "sampled"), "--tasks",
                     str(tmp_path / "heldout.jsonl"), "--out", str(tmp_path / "analysis"),
                     "--tokenizer", "none"]) == 0
    assert f"({traced} traces)" in capsys.readouterr().out
    rows = (tmp_path / "analysis" / "measures.csv").read_text().splitlines()
    assert len(rows) == 1 + traced


@pytest.mark.slow
def test_the_thinking_smoke_demo_writes_traces_for_every_policy_and_transfer_reads_them(tmp_path):
    """`precisecoder demo --smoke --thinking`, then `transfer` of PreciseCoder's traces into the GRPO checkpoint
    (about 2 min at load 12, 4.7 min at load 32 on 2 cores)."""
    out = tmp_path / "demo"
    assert cli.main(["demo", "--smoke", "--thinking", "--out", str(out), "--no-progress"]) == 0
    for where in (out / "eval" / "base", *(out / "seed0" / "eval" / m for m in ("grpo", "precisecoder"))):
        records = [json.loads(line) for line in (where / "t1" / "predictions.jsonl").open()]
        assert len(records) == thinking.EVAL_SAMPLES * 12 and all(r["think_opened"] for r in records)
        assert any(r["thinking"] for r in records)  # a 4-step policy sometimes closes the block at once
    assert cli.main(["transfer", "--donor", str(out / "seed0" / "eval" / "precisecoder" / "t1"),
                     "--checkpoint", str(out / "seed0" / "rl" / "grpo"), "--mode", "at-once",
                     "--tasks", str(out / "data" / "test.jsonl"), "--out", str(tmp_path / "t"),
                     "--workers", "1", "--no-progress"]) == 0
    records = [json.loads(line) for line in (tmp_path / "t" / "predictions.jsonl").open()]
    assert len(records) == 8 and not any(r["think_opened"] for r in records)
