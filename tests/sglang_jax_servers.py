"""Real sglang-jax servers for the tests: `precisecoder serve` on 127.0.0.1, free ports, always stopped.

They need `.venv-sglang-jax` (`scripts/setup.sh sglang-jax`; `.ci/run` makes it); without it
the tests that use them skip, saying so. Random tiny Qwen3s have head_dim 128 (sglang-jax's
Qwen3 fails on smaller heads).
"""

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv-sglang-jax" / "bin" / "python"
# 2 layers on the real Qwen3 vocabulary, so the Qwen3 tokenizer's ids (stops, think tags) are real.
ARCH = dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=128, rope_theta=1e6, tie_word_embeddings=False)

needs_sglang_jax = pytest.mark.skipif(
    not PYTHON.is_file(), reason=f"no sglang-jax venv at {PYTHON}: run `scripts/setup.sh sglang-jax` (CI does)")


def save_random_qwen3(path: Path, seed: int, logit_scale: float = 1.0, **arch) -> Path:
    """A random Qwen3 of ARCH (with `arch` changes) saved with `models.save_pretrained`.

    `logit_scale` multiplies the LM head: a random model's logits are nearly flat over 151,936
    tokens (std 0.16); x25 gives a few dozen tokens most of the mass, so sampled frequencies
    can be tested against the softmax with a few hundred samples.
    """
    from flax import nnx

    import models
    from models.qwen3 import Qwen3, Qwen3Config

    model = Qwen3(Qwen3Config(**{**ARCH, **arch}), rngs=nnx.Rngs(seed))
    if logit_scale != 1.0:
        model.lm_head.weight[...] = model.lm_head.weight[...] * logit_scale
    models.save_pretrained(model, path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_LIBC = ctypes.CDLL(None)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, even killed (Linux; survives the exec)."""
    _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/get_model_info", timeout=5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def serve(*model_dirs: Path, timeout: float = 600.0):
    """One `precisecoder serve` per directory, started together; yields their URLs; stops them all."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs, urls, logs = [], [], []
    try:
        for i, model in enumerate(model_dirs):
            port = free_port()
            log = open(Path(model).parent / f"serve-{port}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, "-m", "jaxrl.cli", "serve", "--model", str(model),
                                           "--port", str(port)], cwd=REPO, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_die_with_parent))
            urls.append(f"http://127.0.0.1:{port}")
        end = time.monotonic() + timeout
        for proc, url, log in zip(procs, urls, logs):
            while not _answers(url):
                if proc.poll() is not None or time.monotonic() > end:
                    log.seek(0)
                    raise RuntimeError(f"sglang-jax server {url} did not start:\n{log.read()[-3000:]}")
                time.sleep(1)
        yield urls
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs:
            log.close()
