"""`precisecoder demo --agent`: agent transcripts of the SFT targets, the agent vocabulary, the refusals,
and the smoke run end to end (slow)."""

import json
import random

import numpy as np
import pytest

from jaxrl import cli
from jaxrl.demo import agent, domain, prompt
from jaxrl.demo.tokenizer import default_vocab, load_demo_tokenizer

CODE = "def f(a, b):\n    x = a + b  # a plus b\n    y = x * 3  # x times 3\n    return y\n"


def test_a_transcript_edits_the_span_of_changed_lines_then_submits():
    fixed = CODE.replace("x * 3", "x * 4")
    assert agent.transcript(CODE, fixed) == [
        "<function=str_replace_editor>\n<parameter=old_str>    y = x * 3  # x times 3</parameter>\n"
        "<parameter=new_str>    y = x * 4  # x times 3</parameter>\n</function>", "<function=submit>\n</function>"]
    rewrite = CODE.replace("a + b", "b + a").replace("x * 3", "3 * x")
    (edit, _) = agent.transcript(CODE, rewrite)
    assert "<parameter=old_str>    x = a + b  # a plus b\n    y = x * 3  # x times 3</parameter>" in edit
    assert agent.transcript(CODE, CODE) == [agent.VIEW, agent.SUBMIT]  # a miss: look, change nothing
    twice = "def f(a):\n    x = a + a\n    x = a + a\n    return x\n"
    (edit, _) = agent.transcript(twice, twice.replace("    x = a + a\n    return", "    x = a * a\n    return"))
    # the changed line occurs twice: old_str grows upwards until it is unique
    assert "<parameter=old_str>    x = a + a\n    x = a + a</parameter>" in edit


def test_sft_transcripts_reach_their_targets_and_train_only_the_replies():
    tok = agent.agent_tokenizer()
    samples = domain.generate(0, 40, "agent-test")
    segments, shares = agent.sft_transcripts(samples, 0.7, 0, 0.15, tok)
    assert sum(shares.values()) == pytest.approx(1) and min(shares.values()) > 0
    tokens, mask = agent.encode_transcripts(segments, tok.pad_id)
    assert tokens.shape[1] <= agent.MAX_CONTEXT
    for row, m, segs, s in zip(tokens, mask, segments, samples):
        replies = [seg for seg in segs if seg.policy]
        assert len(replies) == 2  # edit (or view), then submit
        trained = tok.decode([int(t) for t in row[m > 0]])
        assert trained == "".join(tok.decode(list(seg.token_ids)) for seg in replies)
        assert trained.endswith("<function=submit>\n</function><|im_end|>")
        masked = tok.decode([int(t) for t in row[(m == 0) & (row != tok.pad_id)]])
        assert masked.startswith("<|im_start|>user\nf does what its comments say\n```python\n1 def f(")
        assert ("Edit applied. Lines " in masked) != (replies[0].token_ids[0] == tok.token_id("<function=view>"))
    # a miss (the target is the buggy code) views the file; a fix or a rewrite edits it
    rng = random.Random("sft-agent-targets:0")
    for segs, s in zip(segments, samples):
        target, _ = domain.sft_target(rng, s, 0.7, 0.15)
        first = tok.decode(list(next(seg for seg in segs if seg.policy).token_ids))
        assert first.startswith("<function=view>" if target == s.task.buggy_code else "<function=str_replace_editor>")


def test_the_agent_vocabulary_extends_the_demo_one_without_changing_its_ids():
    plain, tok = load_demo_tokenizer(), agent.agent_tokenizer()
    assert tok.vocab[:plain.vocab_size] == default_vocab() and tok.vocab_size > plain.vocab_size
    s = domain.generate(0, 1, "vocab")[0]
    text = plain.render_chat(prompt.task_messages(s.task)) + prompt.answer(s.task.solution)
    assert tok.encode(text) == plain.encode(text)
    assert len(tok.encode(agent.SUBMIT)) == 3  # two tags and the newline between them


def test_agent_with_thinking_or_baselines_is_refused_with_the_reason(tmp_path, capsys):
    assert cli.main(["demo", "--agent", "--thinking", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--agent and --thinking do not run together" in err and "traces" in err
    assert cli.main(["demo", "--agent", "--with", "dpo", "--out", str(tmp_path / "b")]) == 2
    assert "do not run together" in capsys.readouterr().err


def test_a_run_saved_before_the_agent_setting_still_resumes(tmp_path):
    from jaxrl.demo.run import DemoConfig, _plain, check_resume

    saved = _plain(DemoConfig())
    del saved["agent"]
    (tmp_path / "demo_config.json").write_text(json.dumps(saved))
    check_resume(DemoConfig(), tmp_path)
    with pytest.raises(ValueError, match="agent: False there, True now"):
        check_resume(DemoConfig(agent=True), tmp_path)


@pytest.mark.slow  # 216 s at load 5 to 7 on 2 cores: SFT, three RL runs (one agentic), seven evaluations
def test_demo_smoke_agent_compares_every_policy_inside_the_agent(tmp_path):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--smoke", "--agent", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    table = results["agent"]["methods"]
    assert set(table) == {"base", "grpo", "precisecoder", "precisecoder_agent"}
    assert results["agent"]["max_context"] == agent.MAX_CONTEXT and results["agent"]["turns"] == agent.TURNS
    for name, rows in table.items():
        (row,) = rows
        assert set(agent.TABLE_COLUMNS) <= set(row)
        assert 1 <= row["turns_used"] <= agent.TURNS and 0 <= row["submitted"] <= 100
        assert 0 <= row["no_valid_call"] <= 100 and row["failed_edits"] >= 0
        home = out / "eval" / "base" if name == "base" else out / "seed0" / "eval" / name
        episodes = [json.loads(line) for line in (home / "agent" / "episodes.jsonl").read_text().splitlines()]
        assert len(episodes) == 8 + 4  # the smoke run's held-out buggy and clean tasks
        assert np.mean([len(e["turns"]) for e in episodes]) == pytest.approx(row["turns_used"])
    assert "precisecoder_agent" not in results["methods"]  # the single-turn tables are the usual ones
    sft = json.loads((out / "base" / "sft.json").read_text())
    assert sft["agent_transcripts"] == sft["pairs"] == 64
    metrics = [json.loads(line) for line in
               (out / "seed0" / "rl" / "precisecoder_agent" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["update/logp_gap_max"] <= 1e-4 and "agent/turns_used" in m for m in metrics)
    report = (out / "report.md").read_text()
    assert "## Inside the agent" in report and "PreciseCoder, agentic RL" in report
