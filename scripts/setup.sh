#!/usr/bin/env bash
# Create or refresh .venv at the repo root with everything PreciseCoder-JAX needs.
#   scripts/setup.sh          runtime (the precisecoder command)
#   scripts/setup.sh test     runtime + test dependencies (pytest, hypothesis, torch CPU, ...)
#   scripts/setup.sh sglang-jax   .venv-sglang-jax: a real SGLang server for JAX on CPU or TPU
#                                 (Python 3.12, sglang-jax; what `precisecoder serve` runs under)
#   scripts/setup.sh bcb      .venv-bcb: the libraries BigCodeBench's problems import (scripts/bcb-requirements.txt),
#                             with .venv's own Python, for `--sandbox-env .venv-bcb` (docs/sandbox.md)
# Idempotent: a second run with an unchanged pyproject.toml returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"

if [ "$extras" = sglang-jax ]; then
  # sglang-jax needs Python >= 3.12 and pins flax and transformers apart from .venv: its own venv.
  venv=.venv-sglang-jax
  want="sglang-jax[cpu]==0.1.0rc0"
  stamp="$venv/.precisecoder-setup"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    py="${SGLANG_JAX_PYTHON:-}"
    if [ -z "$py" ]; then
      # pyenv's shims answer only for the selected version, so also try its installed 3.12+ directly.
      for c in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
          py="$c"; break
        fi
      done
    fi
    if [ -z "$py" ]; then
      echo "setup: sglang-jax needs Python >= 3.12 (none found; set SGLANG_JAX_PYTHON=/path/to/python3.12)" >&2
      exit 1
    fi
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    log="$venv/setup.log"
    echo "setup: installing $want into $venv (log: $log)" >&2
    if ! { "$venv/bin/python" -m pip install -q --upgrade pip && "$venv/bin/python" -m pip install -q "$want"; } >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "setup: pip install failed; full log in $log" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
  fi
  echo "setup: ready ($venv, $want)" >&2
  exit 0
fi
if [ "$extras" = bcb ]; then
  # A sandbox runs the host's interpreter and only imports the environment's packages: same Python version.
  venv=.venv-bcb
  req=scripts/bcb-requirements.txt
  py="${PYTHON:-}"
  if [ -z "$py" ] && [ -x .venv/bin/python ]; then
    py="$(.venv/bin/python -c 'import sys; print(sys._base_executable)')"
  fi
  py="${py:-python3}"
  stamp="$venv/.precisecoder-setup"
  want="$(sha256sum < "$req" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    log="$venv/setup.log"
    echo "setup: installing $req into $venv (log: $log)" >&2
    if ! { "$venv/bin/python" -m pip install -q --upgrade pip && "$venv/bin/python" -m pip install -q -r "$req"; } >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "setup: pip install failed; full log in $log" >&2
      exit 1
    fi
    echo "$want" > "$stamp"
  fi
  echo "setup: ready ($venv; use it with --sandbox-env $venv or reward.sandbox_env)" >&2
  exit 0
fi
python="${PYTHON:-python3}"

if ! command -v bwrap >/dev/null 2>&1; then
  echo "setup: installing bubblewrap (the test sandbox)" >&2
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null; })
  elif command -v sudo >/dev/null 2>&1; then
    sudo apt-get install -y -q bubblewrap >/dev/null || { sudo apt-get update -q >/dev/null && sudo apt-get install -y -q bubblewrap >/dev/null; }
  else
    echo "setup: WARNING: cannot install bubblewrap (not root, no sudo); the sandbox will fall back to rlimits only" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
spec=".${extras:+[$extras]}"
stamp=".venv/.precisecoder-setup"
hash="$(sha256sum < pyproject.toml | cut -d' ' -f1)"
want="$hash $spec"
have="$(cat "$stamp" 2>/dev/null || true)"
# The test extras include the runtime: a runtime request after a test set-up has nothing to do.
if [ "$have" != "$want" ] && ! { [ -z "$extras" ] && [ "$have" = "$hash .[test]" ]; }; then
  log=".venv/setup.log"
  echo "setup: installing $spec into .venv (log: $log)" >&2
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e "$spec"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "setup: pip install failed; full log in $log" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
echo "setup: ready (.venv, extras: ${extras:-none})" >&2
