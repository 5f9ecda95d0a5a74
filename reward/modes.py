"""Which sandbox mode a task's tests run in, and why (docs/sandbox.md, "Choosing the mode").

`proxy` runs `assert` tests in a judge process apart from the program, which they
reach only through plain data and handles. That is faithful only while the tests
touch nothing but the program's names: a test that patches a module with
`unittest.mock`, writes a file the program reads, changes the working directory or
the environment, seeds a random generator or captures `sys.stdout` acts on the
judge's process, not the program's, and a correct program would fail there (a
silent wrong verdict). `process_features` finds such uses statically (`ast`);
`choose_mode` sends those tests to `inprocess` and says why.
"""

from __future__ import annotations

import ast
import dataclasses
import functools

from reward.schema import AssertTests, IOTests, Tests, UnittestTests

SET_IN_FILE = "set in the task file"


@dataclasses.dataclass(frozen=True)
class Feature:
    """A use in test code that only works in the program's own process."""

    kind: str  # mock, files, cwd/env, seeds, stdio, modules, matplotlib state
    line: int
    what: str  # the code found, e.g. "unittest.mock" or "tempfile.mkdtemp"

    def __str__(self) -> str:
        return f"{self.kind}: {self.what} (line {self.line})"


_MODULE_KINDS = {
    "unittest.mock": "mock", "mock": "mock", "tempfile": "files", "shutil": "files",
    "contextlib.redirect_stdout": "stdio", "contextlib.redirect_stderr": "stdio",
}
_ATTRIBUTE_KINDS = {
    "os.chdir": "cwd/env", "os.environ": "cwd/env", "os.putenv": "cwd/env", "os.unsetenv": "cwd/env",
    "os.mkdir": "files", "os.makedirs": "files", "os.remove": "files", "os.unlink": "files",
    "os.rmdir": "files", "os.rename": "files", "os.replace": "files", "os.symlink": "files",
    "sys.stdout": "stdio", "sys.stderr": "stdio", "sys.stdin": "stdio", "sys.argv": "stdio",
    "sys.modules": "modules",
    "plt.gcf": "matplotlib state", "plt.gca": "matplotlib state", "plt.get_fignums": "matplotlib state",
    "pyplot.gcf": "matplotlib state", "pyplot.gca": "matplotlib state", "pyplot.get_fignums": "matplotlib state",
}
_NAME_KINDS = {"patch": "mock", "MagicMock": "mock", "Mock": "mock", "redirect_stdout": "stdio",
               "redirect_stderr": "stdio", "open": "files", "mkdtemp": "files", "NamedTemporaryFile": "files",
               "TemporaryDirectory": "files", "mkstemp": "files", "seed": "seeds"}
_METHOD_KINDS = {"seed": "seeds", "manual_seed": "seeds", "setstate": "seeds", "write_text": "files",
                 "write_bytes": "files", "touch": "files", "open": "files"}
_WRITERS = ("to_csv", "to_excel", "to_json", "to_pickle", "savefig", "save")  # write a file when given a path


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of attribute accesses on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement brings in (`from a import b` gives `a.b`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _feature_of(node: ast.AST) -> tuple[str, str] | None:
    """(kind, what) when this one node needs the program's process, else None."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for name in _imported(node):
            for module, kind in _MODULE_KINDS.items():
                if name == module or name.startswith(module + "."):
                    return kind, name
        return None
    if isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if dotted in _ATTRIBUTE_KINDS:
            return _ATTRIBUTE_KINDS[dotted], dotted
        return None
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in _NAME_KINDS:
            return _NAME_KINDS[func.id], func.id
        if isinstance(func, ast.Attribute) and (func.attr in _METHOD_KINDS
                                                or func.attr in _WRITERS and (node.args or node.keywords)):
            return _METHOD_KINDS.get(func.attr, "files"), _dotted(func) or f".{func.attr}"
    if isinstance(node, ast.Name) and node.id in ("__builtins__", "builtins") and isinstance(node.ctx, ast.Load):
        return "modules", node.id
    return None


@functools.lru_cache(maxsize=4096)
def process_features(code: str) -> tuple[Feature, ...]:
    """The first use of each kind of process-bound feature in test code, in line order.

    Code that does not parse has none (its run fails the same way in any mode).
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ()
    first: dict[str, Feature] = {}
    for node in ast.walk(tree):
        found = _feature_of(node)
        if found is not None:
            kind, what = found
            line = getattr(node, "lineno", 0)
            if kind not in first or line < first[kind].line:
                first[kind] = Feature(kind, line, what)
    return tuple(sorted(first.values(), key=lambda f: (f.line, f.kind)))


def _listing(features: tuple[Feature, ...]) -> str:
    return "; ".join(str(f) for f in features)


@functools.lru_cache(maxsize=4096)
def choose_mode(tests: Tests) -> tuple[str, str]:
    """(mode, reason): how these tests run and why.

    `io` tests run the program as a script; `unittest` tests run in the program's
    process; `assert` tests run in `proxy` mode unless they use something only the
    program's process has (then `inprocess`, the reason naming it and its line) or
    their file sets the mode.
    """
    if isinstance(tests, IOTests):
        return "io", "stdin/stdout cases: the program runs as a script"
    features = process_features(tests.code)
    if isinstance(tests, UnittestTests):
        found = f": {_listing(features)}" if features else ""
        return "inprocess", f"unittest tests share the program's process{found}"
    if tests.mode is not None:
        return tests.mode, SET_IN_FILE
    if features:
        return "inprocess", f"the tests need the program's process: {_listing(features)}"
    return "proxy", "assert tests on plain data and handles: the judge's process"


def mode_of(tests: Tests) -> str:
    """The mode these tests run in (see `choose_mode`)."""
    return choose_mode(tests)[0]


def proxy_refusal(code: str) -> str | None:
    """Why these assert tests cannot run faithfully in `proxy` mode, or None when they can."""
    features = process_features(code)
    if not features:
        return None
    return (f"tests.mode 'proxy' would run these tests apart from the program, but they need its process "
            f"({_listing(features)}): drop the mode to let it be chosen, or set 'inprocess'")
