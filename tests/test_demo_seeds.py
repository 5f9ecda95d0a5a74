"""`precisecoder demo --seeds 2` at smoke size: one SFT base, trained once, and one results row per RL seed."""

import json

import pytest
import yaml

from jaxrl import cli
from jaxrl.demo import run as demo_run


# 953 s at load 15 to 45 (nice 15) on 2 cores; the two-seed smoke run itself took 2.1 min at load 12
@pytest.mark.slow
def test_two_rl_seeds_share_one_base_trained_once(tmp_path, monkeypatch):
    trained = []
    real = demo_run.train_base

    def counting(cfg, seed, splits, out, progress):
        trained.append((seed, out))
        return real(cfg, seed, splits, out, progress)

    monkeypatch.setattr(demo_run, "train_base", counting)
    out = tmp_path / "demo"
    assert cli.main(["demo", "--smoke", "--seeds", "2", "--steps", "1", "--out", str(out), "--no-progress"]) == 0
    assert trained == [(0, out / "base")]
    results = json.loads((out / "results.json").read_text())
    for method in ("grpo", "precisecoder"):
        assert [r["seed"] for r in results["methods"][method]] == [0, 1]
        assert [r["seed"] for r in results["t1"][method]] == [0, 1]
        assert [r["seed"] for r in results["greedy"][method]] == [0, 1]
        bases = {yaml.safe_load((out / f"seed{s}" / "rl" / method / "config.yaml").read_text())["model"]["checkpoint"]
                 for s in (0, 1)}
        assert bases == {str(out / "base")}
    assert len(results["methods"]["base"]) == 1
    assert set(results["paired_differences"]["pass"]) == {"per_seed", "mean", "low", "high"}
    assert len(results["paired_differences"]["pass"]["per_seed"]) == 2
    assert results["main_decoding"] == {"name": "t0.6", "temperature": 0.6}
    assert not (out / "seed0" / "base").exists() and not (out / "base1").exists()
