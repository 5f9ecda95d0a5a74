"""Memory, process and CPU limits for a whole sandbox run: one cgroup per worker slot, one run at a time.

A run and everything it forks are placed in the slot's cgroup before the
program starts, so `memory_mb` and `max_processes` bound the run as a whole,
not each process, and the run gets at most `RUN_CPUS` CPUs however many
processes it forks: a run cannot starve the runs beside it. Both layouts are
supported:

- cgroup v1 (separate `memory`, `pids` and, where mounted, `cpu` hierarchies):
  `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap is
  accounted), `pids.max`, `cpu.cfs_quota_us` over `cpu.cfs_period_us`;
  out-of-memory kills are counted by `oom_kill` in `memory.oom_control`.
- cgroup v2 (one unified tree): `memory.max`, `memory.swap.max`, `pids.max`,
  `cpu.max` where the cpu controller can be enabled; `oom_kill` in
  `memory.events`; `cgroup.kill` ends every process at once.

Groups are made under this process's own cgroup when it is writable, else under
the hierarchy's root. Where neither layout is writable (no root, no delegation),
`RunCgroup.create` returns None and runs keep only their per-process rlimits
(address space, process count per uid); `docs/sandbox.md` says what that loses.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
RUN_CPUS = 1.0  # CPU bandwidth of one run, in CPUs
CPU_PERIOD_US = 100_000


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup text."""
    paths = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _write(path: Path | str, value: str) -> None:
    """Write a control file with one write(2), as the kernel wants (no file object: some run per sandbox run)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: Path | str) -> str:
    """A control file's whole text."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, 1 << 16)]
        while chunks[-1]:
            chunks.append(os.read(fd, 1 << 16))
        return b"".join(chunks).decode()
    finally:
        os.close(fd)


class RunCgroup:
    """One worker slot's cgroup(s): set the run's limits, add its first process, count OOM kills, kill all."""

    def __init__(self, version: int, dirs: list[Path]):
        self.version, self.dirs = version, dirs
        # The control files touched for every run, as strings made once.
        self._procs = [str(d / "cgroup.procs") for d in dirs]
        events = "memory.events" if version == 2 else "memory.oom_control"
        self._oom_events = next((str(d / events) for d in dirs if (d / events).exists()), None)

    @classmethod
    def create(cls, name: str, root: Path = ROOT, proc_cgroup: str | None = None) -> RunCgroup | None:
        """A fresh cgroup named `name` (v1 memory+pids, with cpu where mounted, else v2), or None where neither is writable."""
        if proc_cgroup is None:
            try:
                proc_cgroup = Path("/proc/self/cgroup").read_text()
            except OSError:
                return None
        own = _own_paths(proc_cgroup)
        v1 = [root / "memory", root / "pids"]
        if all((d / "cgroup.procs").exists() for d in v1):
            if (root / "cpu" / "cpu.cfs_quota_us").exists():
                v1.append(root / "cpu")
            dirs = cls._make([[d / own.get(d.name, "/").lstrip("/"), d] for d in v1], name)
            if dirs:
                return cls(1, dirs)
        unified = root if (root / "cgroup.controllers").exists() else root / "unified"
        if (unified / "cgroup.controllers").exists():
            dirs = cls._make([[unified / own.get("", "/").lstrip("/"), unified]], name, v2=True)
            if dirs:
                return cls(2, dirs)
        return None

    @staticmethod
    def _make(candidates: list[list[Path]], name: str, v2: bool = False) -> list[Path] | None:
        """For each hierarchy, a new group under its first writable candidate parent; None if any fails."""
        made: list[Path] = []
        for parents in candidates:
            for parent in parents:
                group = parent / name
                _remove_orphans(parent, 2 if v2 else 1)
                try:
                    if v2:
                        enabled = (parent / "cgroup.subtree_control").read_text().split()
                        missing = [c for c in ("memory", "pids", "cpu") if c not in enabled]
                        if missing:
                            try:
                                _write(parent / "cgroup.subtree_control", " ".join("+" + c for c in missing))
                            except OSError:  # cpu is optional: not every delegation grants it
                                rest = [c for c in missing if c != "cpu"]
                                if len(rest) == len(missing):
                                    raise
                                if rest:
                                    _write(parent / "cgroup.subtree_control", " ".join("+" + c for c in rest))
                    group.mkdir()
                    if v2 and not all((group / f).exists() for f in ("memory.max", "pids.max")):
                        group.rmdir()
                        continue
                    if not v2 and not any((group / f).exists() for f in
                                          ("memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us")):
                        group.rmdir()
                        continue
                    made.append(group)
                    break
                except OSError:
                    continue
            else:
                for group in made:
                    try:
                        group.rmdir()
                    except OSError:
                        pass
                return None
        return made

    def set_limits(self, memory_mb: int, max_processes: int) -> None:
        """Limits for the next run (the group must be empty); the CPU bound is `RUN_CPUS` for every run."""
        memory = str(memory_mb << 20)
        quota = int(RUN_CPUS * CPU_PERIOD_US)
        for d in self.dirs:
            if self.version == 2:
                _write(d / "memory.max", memory)
                if (d / "memory.swap.max").exists():
                    _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(max_processes))
                if (d / "cpu.max").exists():
                    _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            elif (d / "cpu.cfs_quota_us").exists():
                _write(d / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(d / "cpu.cfs_quota_us", str(quota))
            elif (d / "memory.limit_in_bytes").exists():
                limit, memsw = d / "memory.limit_in_bytes", d / "memory.memsw.limit_in_bytes"
                try:
                    _write(limit, memory)
                except OSError:  # growing past the swap limit: raise that one first
                    _write(memsw, memory)
                    _write(limit, memory)
                if memsw.exists():
                    try:
                        _write(memsw, memory)
                    except OSError:
                        pass
            else:
                _write(d / "pids.max", str(max_processes))

    def add(self, pid: int) -> None:
        """Move process `pid` (host pid) into the group; its children are born there."""
        for procs in self._procs:
            _write(procs, str(pid))

    @property
    def cpu_bounded(self) -> bool:
        """Whether runs in this group get at most `RUN_CPUS` CPUs."""
        return any((d / "cpu.max").exists() or (d / "cpu.cfs_quota_us").exists() for d in self.dirs)

    def oom_kills(self) -> int:
        """How many processes the kernel has killed for exceeding the group's memory limit so far."""
        if self._oom_events is not None:
            for line in _read(self._oom_events).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def pids(self) -> list[int]:
        found: set[int] = set()
        for procs in self._procs:
            try:
                found.update(int(p) for p in _read(procs).split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill_all(self, wait_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; False if some survived `wait_s`."""
        if self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                _write(self.dirs[0] / "cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and delete the group."""
        self.kill_all(wait_s=2.0)
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _remove_orphans(parent: Path, version: int) -> None:
    """Kill the processes of groups left by sandbox owners that died without closing (named
    precisecoder-PID-...), then delete the groups."""
    try:
        entries = list(parent.glob("precisecoder-*"))
    except OSError:
        return
    for group in entries:
        owner = group.name.split("-")[1]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        RunCgroup(version, [group]).remove()
