"""What every host of a run must share, as named items, and the check that they do.

On a pod each host reads its own config, task files and code. A host that differs
(another checkout, an edited task file, an extra `--set`) would sample, score or shard
differently and fail much later in a collective with an unrelated message, or not at
all. `check_hosts_agree` compares every host's items with host 0's at start, before
any model is built, and names the first that differs.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

import jax

from jaxrl import hosts
from jaxrl.config import Config, to_dict
from jaxrl.tasks import build_dir, task_paths

PACKAGES = ("jaxrl", "models", "reward")  # the source trees whose code every host must run alike
# Where a host finds things: paths are resolved from each host's working directory, so they may
# differ; what they hold must not (task files are compared by content below).
LOCATIONS = ("data.train", "data.val", "data.gt_debug", "data.build.cache_dir", "run.out", "model.checkpoint")


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(d, dict) and d:
        return {k: v for key in d for k, v in _flat(d[key], f"{prefix}{key}.").items()}
    return {prefix[:-1]: repr(d)}


def source_digest(root: Path = Path(__file__).resolve().parents[1]) -> str:
    """A hash of the project's Python sources and package data (paths and contents)."""
    h = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".yaml", ".txt", ".jsonl") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:16]


def run_items(cfg: Config) -> dict[str, str]:
    """The items hosts must agree on, in the order they are checked: package version and
    sources, every resolved config key but the `LOCATIONS`, every task file's contents (explicit or built)."""
    try:
        version = importlib.metadata.version("precisecoder-jax")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    items = {"package version": version, "package sources": source_digest()}
    items |= {f"config {k}": v for k, v in _flat(to_dict(cfg)).items() if k not in LOCATIONS}
    built = build_dir(cfg.data.build) if cfg.data.build is not None else None
    for split, path in task_paths(cfg.data, built).items():
        if path is not None:
            file = Path(path).expanduser()
            items[f"task file data.{split}"] = _sha(file.read_bytes()) if file.is_file() else "absent"
    return items


def check_hosts_agree(cfg: Config) -> None:
    """Raise `hosts.HostsDisagree` on every host when one host's `run_items` differ from host 0's."""
    if jax.process_count() > 1:
        hosts.check_same(run_items(cfg))
