"""`precisecoder demo --small`: the whole pipeline on real components, tiny sizes; the three files."""

import json

import pytest

from jaxrl import cli


@pytest.mark.slow
def test_demo_small_writes_report_results_and_curves(tmp_path):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--small", "--steps", "2", "--sft-steps", "4", "--out", str(out), "--no-progress",
                     "--with", "grpo_f1sum"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"base", "grpo", "precisecoder", "grpo_f1sum"}
    for rows in results["methods"].values():
        assert [set(r) for r in rows] == [{"seed", "pass", "precision", "recall", "lines", "lines_pass", "noop",
                                          "damage"}]
        assert all(0 <= r["pass"] <= 100 and 0 <= r["damage"] <= 100 for r in rows)
    assert set(results["greedy"]) == set(results["t1"]) == set(results["methods"])
    report = (out / "report.md").read_text()
    assert "T = 0.6 sampling (the main table)" in report and "T = 1 sampling" in report and "Greedy decoding" in report and "PreciseCoder" in report
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    for method in ("grpo", "precisecoder", "grpo_f1sum"):
        assert (out / "seed0" / "rl" / method / "checkpoints" / "2").is_dir()
    # A second call with --resume reuses every finished part.
    assert cli.main(["demo", "--small", "--steps", "2", "--sft-steps", "4", "--out", str(out), "--no-progress",
                     "--with", "grpo_f1sum", "--resume"]) == 0


def test_bad_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["demo", "--seeds", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--seeds" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    assert cli.main(["demo", "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_resume_refuses_other_settings_but_allows_more_seeds(tmp_path, capsys):
    from jaxrl.demo.run import DemoConfig, _plain

    out = tmp_path / "run"
    out.mkdir()
    (out / "demo_config.json").write_text(json.dumps(_plain(DemoConfig(rl_steps=7))))
    assert cli.main(["demo", "--out", str(out), "--steps", "8", "--resume"]) == 2
    assert "rl_steps: 7 there, 8 now" in capsys.readouterr().err
    assert cli.main(["demo", "--out", str(out), "--sft-steps", "9", "--steps", "7", "--resume"]) == 2
    assert "sft.steps" in capsys.readouterr().err
    from jaxrl.demo.run import check_resume
    check_resume(DemoConfig(rl_steps=7, seeds=3, methods=("grpo", "precisecoder", "ea_grpo")), out)


def test_cpu_devices_sets_the_xla_device_count_unless_it_is_set(tmp_path, capsys):
    from jaxrl.demo.cli import split_host

    env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    split_host(env, 2)
    assert env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=2"
    fixed = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    split_host(fixed, 2)
    assert fixed["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    empty: dict[str, str] = {}
    split_host(empty, 1)
    assert empty == {}
    assert cli.main(["demo", "--cpu-devices", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--cpu-devices" in capsys.readouterr().err
