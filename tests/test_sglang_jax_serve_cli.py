"""`precisecoder serve`'s arguments and its server file's isolation (no sglang-jax needed)."""

import ast
import sys

import pytest

from jaxrl import serve_cli
from jaxrl.cli import main


def test_usage_errors_are_one_line_with_exit_2(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "none"), "--port", "30000", "--python", sys.executable]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main(["serve", "--model", str(tmp_path), "--port", "30000", "--python", str(tmp_path / "py")]) == 2
    assert f"no sglang-jax Python at {tmp_path / 'py'}" in capsys.readouterr().err
    assert main(["serve", "--model", str(tmp_path), "--port", "70000", "--python", sys.executable]) == 2
    assert "not a port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", "30000"])
    assert e.value.code == 2 and "--model" in capsys.readouterr().err


def test_the_server_command_forces_as_many_cpu_devices_as_its_mesh(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(serve_cli.os, "execve", lambda *a: calls.append(a))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x")
    assert main(["serve", "--model", str(tmp_path), "--port", "30001", "--python", sys.executable,
                 "--tp-size", "2"]) == 0
    (python, argv, env), = calls
    assert python == sys.executable and argv[1] == str(serve_cli.SERVER)
    assert argv[argv.index("--port") + 1] == "30001" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"
    assert env["JAX_PLATFORMS"] == "cpu" and "PYTHONPATH" not in env


def test_the_server_file_imports_only_the_stdlib_and_sglang_jax():
    """It runs under another Python with other pins: it must not import the project's packages."""
    tree = ast.parse(serve_cli.SERVER.read_text())
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert roots - set(sys.stdlib_module_names) == {"sgl_jax", "jax", "flax", "fastapi"}
