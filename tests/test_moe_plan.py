"""`precisecoder plan` on the mixture-of-experts presets: active parameters, an expert mesh axis, refusal."""

import json

import pytest

from jaxrl.cli import main as cli_main


def _plan(capsys, *argv):
    rc = cli_main(["plan", *argv, "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err


@pytest.mark.parametrize("name,total,active", [("qwen3-30b-a3b-h200x8", 30.5e9, 3.3e9),
                                               ("qwen3_5-35b-a3b-h200x8", 34.7e9, 3.4e9)])
def test_moe_presets_fit_and_count_active_parameters_for_flops(name, total, active, capsys):
    rc, report, err = _plan(capsys, name)
    assert rc == 0 and report["fits"], err
    model = report["model"]
    assert abs(model["params"] - total) < 0.1e9 and abs(model["active_params"] - active) < 0.1e9
    assert report["mesh"] == {"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}
    # FLOPs follow the active parameters: 6 per active parameter per token within 2x (attention adds the rest)
    b = report["batch"]
    per_token = report["train_step_flops"] / (b["rows"] * b["seq"])
    assert 6 * model["active_params"] < per_token < 12 * model["active_params"]


def test_a_moe_preset_with_too_many_experts_is_refused(capsys):
    rc, report, err = _plan(capsys, "qwen3-30b-a3b-h200x8", "--set", "model.architecture.num_experts=1024")
    assert rc == 1 and report["fits"] is False
    assert report["model"]["params"] > 200e9
    assert "does not fit: the train step needs" in err and "largest: optimizer state" in err
