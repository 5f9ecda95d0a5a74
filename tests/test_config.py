"""The run config: typed YAML loading, overrides, errors that name the key, round trips."""

from pathlib import Path

import pytest
import yaml

from jaxrl import config as C

REPO = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".venv-sglang-jax", "runs", ".git", "node_modules"}


def _repo_yamls():
    return sorted(p for p in REPO.rglob("*.y*ml") if p.suffix in (".yaml", ".yml")
                  and not SKIP & set(p.relative_to(REPO).parts))


@pytest.mark.parametrize("path", _repo_yamls(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_in_the_repo_parses(path):
    if path.parent in C.config_dirs():
        cfg = C.load_config(path)
        assert C.load_config(data=yaml.safe_load(C.to_yaml(cfg))) == cfg
    else:
        yaml.safe_load(path.read_text())


def test_named_configs_resolve_by_name_and_path():
    assert "tiny" in C.config_names()
    by_name = C.load_config("tiny")
    assert by_name == C.load_config(C.resolve_path("tiny"))
    assert by_name.model.family == "qwen3" and by_name.data.build is not None


def test_overrides_are_typed():
    cfg = C.load_config("tiny", ["run.steps=7", "optimizer.learning_rate=3e-6", "rollout.thinking_budget=null",
                                 "mesh.rules.embed=[fsdp, tensor]", "rollout.options.urls=[a, b]",
                                 "loss.dual_clip=null", "algorithm.options.eps=1e-4"])
    assert cfg.run.steps == 7 and cfg.optimizer.learning_rate == 3e-6
    assert cfg.rollout.thinking_budget is None and cfg.loss.dual_clip is None
    assert cfg.mesh.rules["embed"] == ("fsdp", "tensor")
    assert cfg.rollout.options["urls"] == ["a", "b"]
    assert cfg.algorithm.options["eps"] == 1e-4


@pytest.mark.parametrize("override, named", [
    ("run.stepz=3", "run.stepz"),
    ("nosuch.key=1", "nosuch"),
    ("run.steps=abc", "run.steps"),
    ("run.steps=2.5", "run.steps"),
    ("run.progress=1", "run.progress"),
    ("model.dtype=fp8", "model.dtype"),
    ("algorithm.name=ppo", "algorithm.name"),
    ("rollout.group_size=0", "rollout.group_size"),
    ("mesh.rules.embed=[foo]", "mesh.rules.embed"),
    ("rollout.temperature=0.5", "loss.temperature"),
    ("run.steps", "run.steps"),
    ("run.steps.x=1", "run.steps"),
    ("data.prompt_multiple=0", "data.prompt_multiple"),
])
def test_bad_values_name_the_key(override, named):
    with pytest.raises(C.ConfigError, match=named.replace(".", r"\.")):
        C.load_config("tiny", [override])


def test_missing_sections_and_model_source(tmp_path):
    with pytest.raises(C.ConfigError, match="missing key model"):
        C.load_config(data={"data": {"train": "x.jsonl"}})
    with pytest.raises(C.ConfigError, match="exactly one of model.checkpoint"):
        C.load_config(data={"model": {"checkpoint": "a", "architecture": {}}, "data": {"train": "x"}})
    with pytest.raises(C.ConfigError, match="data.train"):
        C.load_config(data={"model": {"checkpoint": "a"}, "data": {}})


def test_base_chain_merges_and_detects_cycles(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text("base: tiny\nrun:\n  steps: 3\nrollout:\n  group_size: 2\n")
    cfg = C.load_config(child)
    tiny = C.load_config("tiny")
    assert cfg.run.steps == 3 and cfg.rollout.group_size == 2
    assert cfg.run.eval_every == tiny.run.eval_every and cfg.model == tiny.model
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(C.ConfigError, match="its own base"):
        C.load_config(loop)


def test_unknown_name_and_bad_yaml(tmp_path):
    with pytest.raises(C.ConfigError, match="no config 'nope'"):
        C.load_config("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1,\n")
    with pytest.raises(C.ConfigError, match="not valid YAML"):
        C.load_config(bad)


@pytest.mark.parametrize("path", sorted((REPO / "tpu_configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_preset_gives_its_engine_only_options_it_takes(path):
    """A preset's `rollout.options` become the engine's keyword arguments: an unknown one is a TypeError at start."""
    import inspect

    from jaxrl.rollout.jax_engine import JaxEngine
    from jaxrl.rollout.sglang_engine import SGLangEngine

    cfg = C.load_config(path)
    engine = {"jax": JaxEngine, "sglang": SGLangEngine}[cfg.rollout.engine]
    inspect.signature(engine).bind_partial(**cfg.rollout.options)
    if cfg.rollout.engine == "sglang":
        assert cfg.rollout.options.get("weights_dir"), "training with sglang needs rollout.options.weights_dir"
