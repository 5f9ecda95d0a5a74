"""Library set-up of a sandbox server, before it forks anything: the environment's packages and the preload list.

Stdlib only (prepended, after the codec, to the zygote's and the judge's
sources). The host passes the set-up as the servers' fourth argument, JSON:
`paths`, the library environment's site-packages directories (bound read-only
at the same paths, added to `sys.path` here; their `.pth` files are not run),
and `preload`, modules to import now so that every run, forked from this
server, shares them copy-on-write instead of importing them again. A module
that does not import is skipped. Forking gives each run its own copy of all
that state, so what a run changes in a preloaded module dies with the run.
numpy's global random state is reseeded in each forked child (as `random`
reseeds itself), so unseeded runs do not all draw the same numbers.
"""

import gc
import importlib
import json
import os
import sys


def _vm_bytes():
    """This process's address space, from /proc/self/status (0 where it cannot be read)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 0


def _reseed_numpy():
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def load_libraries(argv):
    """Apply the set-up in `argv[4]` (if any); returns the address space the preloaded modules added.

    Runs' address-space limits add that amount: the preloaded image is shared,
    not the run's own allocation. Refuses to go on if an import left a thread
    running: the servers' namespaces and forks need a single-threaded process.
    """
    setup = json.loads(argv[4]) if len(argv) > 4 else {}
    before = _vm_bytes()
    sys.path.extend(setup.get("paths", []))
    for name in setup.get("preload", []):
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or broken in this environment: runs import it themselves
            continue
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise RuntimeError(f"preloading {setup.get('preload')} started {threads - 1} thread(s); "
                           "set the library's thread count to 1 or leave it out of the preload list")
    os.register_at_fork(after_in_child=_reseed_numpy)
    gc.freeze()  # a run's collections then skip (and so do not copy) the shared pages of every preloaded object
    return max(0, _vm_bytes() - before)
