"""The part of the `inprocess` harness that runs after the program has loaded (see reward/sandbox_harness.py).

Sealed: `seal` compiles this source so that every global and built-in name below
resolves in a private dict held only as a constant of the code, filled by
`reward/sandbox_harness.py` before the program loads. Rewriting a module, a
global dict or `builtins` changes nothing here, and the hook refuses reading
`__code__` of these functions. Stdlib only, no imports: everything it uses is
in that dict (`token`, `host_fd`, `plan`, `trusted_ids`, captured functions ...).
"""


# ---- the audit hook ---------------------------------------------------------------------

def audit(event, args):
    """Refuse, for the rest of the run, what would reach the harness's or the tests' frames, code or memory."""
    if not armed[0]:
        return
    if event in refused_events:
        refuse(event)
    elif event == "sys._getframe":
        raise RuntimeError("refused in the sandbox: " + event)
    elif event == "object.__getattr__":
        if args[1] in frame_attributes:
            raise RuntimeError("refused in the sandbox: " + args[1])  # blocked, not held against the run
        if args[1] == "__code__" and is_sealed(args[0]):
            refuse(event + " " + str(args[1]))
    elif event == "object.__setattr__":
        if is_sealed(args[0]):
            refuse(event + " " + str(args[1]))
    elif event == "open":
        if is_memory_file(args[0]):
            refuse(event + " " + str(args[0])[:100])


def refuse(what):
    """Raise, and fail the run even if the program catches it: these have no use but reaching the harness."""
    refused.append(what)
    raise RuntimeError("refused in the sandbox: " + what)


def is_sealed(obj):
    """A function of the tests or of this harness (whose `__code__` holds the sealed names)."""
    if type(obj) is not function_type:
        return False
    g = function_globals(obj)
    return g is tests_globals or g is harness_globals


def is_memory_file(path):
    """A process's memory file under /proc, or a memory device."""
    if type(path) is bytes:
        path = path.decode("utf-8", "replace")
    if type(path) is not str:
        return False
    parts = (path if path[:1] == "/" else current_dir() + "/" + path).split("/")
    return "proc" in parts and parts[-1] == "mem" or "dev" in parts and parts[-1] in ("mem", "kmem", "port")


# ---- values of the program against values of the tests ------------------------------------

def untrusted(t):
    """A class made after the program started loading (the program's own, or made at its request)."""
    return id(t) not in trusted_ids


def rebuild(x, depth=0):
    """`x` with every instance of a program subclass of a plain type replaced by its base value (deeply)."""
    if depth > 100:
        raise RecursionError("value nested too deeply to compare")
    t = type(x)
    if id(t) in scalar_ids:
        return x
    if t is list:
        return [rebuild(i, depth + 1) for i in x]
    if t is tuple:
        return tuple(rebuild(i, depth + 1) for i in x)
    if t is dict:
        return {rebuild(k, depth + 1): rebuild(v, depth + 1) for k, v in dict_items(x)}
    if t is set or t is frozenset:
        return t(rebuild(i, depth + 1) for i in x)
    if untrusted(t):
        for base in mro_of(t):
            if id(base) in base_values:
                return rebuild(base_values[id(base)](x), depth + 1)
    return x


def tainted(x, depth=0):
    """Whether a rebuilt value holds an object of a program class (inside plain containers)."""
    if depth > 100:
        return True
    t = type(x)
    if t is list or t is tuple or t is set or t is frozenset:
        return any(tainted(i, depth + 1) for i in x)
    if t is dict:
        return any(tainted(k, depth + 1) or tainted(v, depth + 1) for k, v in dict_items(x))
    return untrusted(t)


def strict_bool(r):
    if type(r) is not bool:
        raise TypeError("a comparison between two objects of the program must return a bool")
    return r


def same(a, b, depth=0):
    """Equality of two rebuilt values where one holds an object of the program (proxy mode's rules):
    such an object never equals a value of the tests; between two, the program's `==` decides."""
    if depth > 100:
        raise RecursionError("value nested too deeply to compare")
    ua, ub = untrusted(type(a)), untrusted(type(b))
    if ua or ub:
        return ua and ub and strict_bool(a == b)
    ta, tb = type(a), type(b)
    if ta is list or ta is tuple or tb is list or tb is tuple:
        if ta is not tb or len(a) != len(b):
            return False
        return all(same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b) or any(tainted(k) for k in a):
            return False
        return all(k in b and same(v, b[k], depth + 1) for k, v in dict_items(a))
    if tainted(a) or tainted(b):
        return False
    return bool(a == b)


def member(item, container):
    """`item in container` under the same rules."""
    if untrusted(type(container)):
        return strict_bool(item in container)
    if type(container) is str or type(container) is bytes:
        return type(item) is type(container) and item in container
    if type(container) is dict:
        return not tainted(item) and item in container
    if type(container) in (list, tuple, set, frozenset):
        return any(same(item, x) for x in container)
    if tainted(item):
        return False
    return item in container


def compare(op, a, b):
    """The tests' `a op b` (rewritten by `seal`): native when no object of the program takes part."""
    ra, rb = rebuild(a), rebuild(b)
    if op == "in" or op == "not in":
        found = member(ra, rb) if tainted(ra) or tainted(rb) else ra in rb
        return found if op == "in" else not found
    if not tainted(ra) and not tainted(rb):
        return operators[op](ra, rb)
    if op == "==":
        return same(ra, rb)
    if op == "!=":
        return not same(ra, rb)
    if untrusted(type(ra)) and untrusted(type(rb)):
        return strict_bool(operators[op](ra, rb))
    raise TypeError("a value of the program and a value of the tests are not ordered")


def checked_call(fn, *args, **kwargs):
    """A library assertion of the tests, between two checks that no protected module was changed."""
    tampered()
    result = fn(*args, **kwargs)
    tampered()
    return result


def checked_attribute(owner, name, *args, **kwargs):
    """`owner.name(...)` for an `assert_*` name: from a protected module, the function it held before the
    program loaded; from anything else (a mock), its attribute now."""
    snapshot = dict_get(snapshot_of, id(owner))
    if snapshot is not None and dict_get(modules_by_id, id(owner)) is owner:
        if name not in snapshot:
            raise AttributeError(name)
        return checked_call(snapshot[name], *args, **kwargs)
    return checked_call(getattr(owner, name), *args, **kwargs)


def tampered():
    changed = protected_intact()
    if changed:
        refuse("the program changed " + changed)


def truth(r):
    """`bool` of a comparison's result (a numpy array raises, as in plain unittest)."""
    return r if type(r) is bool else bool(r)


def show(x):
    try:
        text = repr(x)
    except BaseException:
        text = "<unprintable " + type(x).__name__ + ">"
    return text if len(text) <= 200 else text[:200] + "..."


def fail(msg, standard):
    raise failure(standard if msg is None else str(msg) + " : " + standard)


# ---- the assertions bound on every test instance (they shadow unittest's) ------------------

def assertEqual(self, first, second, msg=None):
    if not truth(compare("==", first, second)):
        fail(msg, show(first) + " != " + show(second))


def assertNotEqual(self, first, second, msg=None):
    if not truth(compare("!=", first, second)):
        fail(msg, show(first) + " == " + show(second))


def assertTrue(self, expr, msg=None):
    if not expr:
        fail(msg, show(expr) + " is not true")


def assertFalse(self, expr, msg=None):
    if expr:
        fail(msg, show(expr) + " is not false")


def assertIs(self, first, second, msg=None):
    if first is not second:
        fail(msg, show(first) + " is not " + show(second))


def assertIsNot(self, first, second, msg=None):
    if first is second:
        fail(msg, "unexpectedly identical: " + show(first))


def assertIsNone(self, obj, msg=None):
    if obj is not None:
        fail(msg, show(obj) + " is not None")


def assertIsNotNone(self, obj, msg=None):
    if obj is None:
        fail(msg, "unexpectedly None")


def assertIn(self, member, container, msg=None):
    if not compare("in", member, container):
        fail(msg, show(member) + " not found in " + show(container))


def assertNotIn(self, member, container, msg=None):
    if not compare("not in", member, container):
        fail(msg, show(member) + " unexpectedly found in " + show(container))


def assertIsInstance(self, obj, cls, msg=None):
    if not issubclass(type(obj), cls):
        fail(msg, show(obj) + " is not an instance of " + show(cls))


def assertNotIsInstance(self, obj, cls, msg=None):
    if issubclass(type(obj), cls):
        fail(msg, show(obj) + " is an instance of " + show(cls))


def ordered(op, name):
    def check(self, a, b, msg=None):
        if not truth(compare(op, a, b)):
            fail(msg, show(a) + " not " + name + " " + show(b))
    return check


def assertAlmostEqual(self, first, second, places=None, msg=None, delta=None):
    if not almost(first, second, places, delta):
        fail(msg, show(first) + " != " + show(second) + " within the tolerance")


def assertNotAlmostEqual(self, first, second, places=None, msg=None, delta=None):
    if almost(first, second, places, delta):
        fail(msg, show(first) + " == " + show(second) + " within the tolerance")


def almost(first, second, places, delta):
    """unittest's rule, on rebuilt values; no arithmetic between an object of the program and the tests'."""
    a, b = rebuild(first), rebuild(second)
    if tainted(a) or tainted(b):
        return same(a, b)
    if a == b:
        return True
    if delta is not None and places is not None:
        raise TypeError("specify delta or places not both")
    if delta is not None:
        return abs(a - b) <= delta
    return round(abs(a - b), 7 if places is None else places) == 0


def assertCountEqual(self, first, second, msg=None):
    a, b = list(rebuild(first)), list(rebuild(second))
    if len(a) == len(b):
        for x in a:
            for i in range(len(b)):
                if same(x, b[i]) if tainted(x) or tainted(b[i]) else truth(x == b[i]):
                    del b[i]
                    break
            else:
                break
    if len(a) != len(first) or b:
        fail(msg, "element counts differ: " + show(first) + " vs " + show(second))


def checked_assertions():
    """name -> function: what every test instance gets bound in its own `__dict__`."""
    table = {"assertEqual": assertEqual, "assertNotEqual": assertNotEqual, "assertTrue": assertTrue,
             "assertFalse": assertFalse, "assertIs": assertIs, "assertIsNot": assertIsNot,
             "assertIsNone": assertIsNone, "assertIsNotNone": assertIsNotNone, "assertIn": assertIn,
             "assertNotIn": assertNotIn, "assertIsInstance": assertIsInstance,
             "assertNotIsInstance": assertNotIsInstance, "assertAlmostEqual": assertAlmostEqual,
             "assertNotAlmostEqual": assertNotAlmostEqual, "assertCountEqual": assertCountEqual,
             "assertGreater": ordered(">", "greater than"), "assertGreaterEqual": ordered(">=", "greater or equal to"),
             "assertLess": ordered("<", "less than"), "assertLessEqual": ordered("<=", "less or equal to")}
    for alias in ("assertListEqual", "assertTupleEqual", "assertDictEqual", "assertSetEqual",
                  "assertSequenceEqual", "assertMultiLineEqual"):
        table[alias] = assertEqual
    return table


# ---- running the tests ---------------------------------------------------------------------

def report(line):
    """One line of the run's story on stderr (the program can write there too: it is only informative)."""
    try:
        data = (line + "\n").encode("utf-8", "replace")
        while data:
            data = data[os_write(2, data):]
    except BaseException:
        pass


def describe(exc):
    try:
        return type(exc).__name__ + ": " + str(exc)[:500]
    except BaseException:
        return type(exc).__name__


def outcome_of(exc, expected_skip):
    """A test part's exception as a status: a skip counts only where the source asked for it."""
    if isinstance(exc, skip_exception):
        return "skip" if expected_skip else "fail"
    if isinstance(exc, failure):
        return "fail"
    return "error"


def protected_intact():
    """The name of the first protected module entry that was changed since the program started, else None.

    Only functions, classes and modules are held (plain settings such as `numpy.pi` may change);
    allowed: what the tests' source names as a patch target (`patch("numpy.random.normal")`,
    `patch.object(x, "name")`).
    """
    get, absent, items = dict_get, missing, dict_items  # locals: sealed code looks each global up in a dict
    paths, names, shadows = patched_paths, patched_names, builtin_names
    for name, module_dict, snapshot, keys in snapshots:
        for key, value in items(snapshot):
            if get(module_dict, key, absent) is not value and key not in names \
                    and name + "." + key not in paths:
                return name + "." + key
        for key in module_dict:
            if key not in keys and key in shadows:
                return name + "." + key
    for name, module in modules_snapshot:
        if dict_get(sys_modules, name, missing) is not module:
            return "sys.modules[" + name + "]"
    return None


def run_part(fn, args, skip_ok, name, where):
    """Call one part of a test; its status ('pass', 'fail', 'error' or 'skip')."""
    try:
        fn(*args)
    except BaseException as e:
        status = outcome_of(e, skip_ok)
        report(status.upper() + ": " + name + " (" + where + "): " + describe(e))
        return status
    return "pass"


def worst(a, b):
    return a if order[a] >= order[b] else b


def run_test(cls, name, parts, bindings):
    """One test as unittest runs it: a fresh instance, setUp, the method, tearDown, cleanups."""
    full = parts["class_name"] + "." + name
    if parts["skip"] or parts["methods"][name][1]:
        return "skip"
    method, _, expecting_failure = parts["methods"][name]
    inst = object_new(cls)
    testcase_init(inst, name)
    own = instance_dict(inst)
    for key, fn in dict_items(bindings):
        own[key] = bind(fn, inst)
    own["failureException"] = failure
    status = run_part(parts["setUp"], (inst,), False, full, "setUp")
    if status == "pass":
        status = run_part(method, (inst,), False, full, "test")
        if expecting_failure:
            status = "pass" if status in ("fail", "error") else "fail"
        status = worst(status, run_part(parts["tearDown"], (inst,), False, full, "tearDown"))
    cleanups = own.get("_cleanups")
    while type(cleanups) is list and cleanups:
        fn, args, kwargs = cleanups.pop()
        status = worst(status, run_part(lambda: fn(*args, **kwargs), (), False, full, "cleanup"))
    return status


def run_class(cls, parts, bindings):
    """Every test of one class, between setUpClass and tearDownClass (the class writable only then)."""
    names = sorted(parts["methods"])
    if parts["skip"]:
        return [(parts["class_name"] + "." + n, "skip") for n in names]
    thaw(cls)
    start = run_part(parts["setUpClass"], (), False, parts["class_name"], "setUpClass")
    freeze(cls)
    if start != "pass":
        return [(parts["class_name"] + "." + n, "error") for n in names]
    results = []
    for name in names:
        changed = protected_intact()
        status = "error" if changed else run_test(cls, name, parts, bindings)
        changed = changed or protected_intact()
        if changed:
            report("ERROR: " + parts["class_name"] + "." + name + ": the program changed " + changed)
            status = "error"
        if refused:
            status = "error"
        results.append((parts["class_name"] + "." + name, status))
    thaw(cls)
    end = run_part(parts["tearDownClass"], (), False, parts["class_name"], "tearDownClass")
    end = worst(end, run_part(parts["doClassCleanups"], (), False, parts["class_name"], "class cleanups"))
    freeze(cls)
    if end != "pass":
        results = [(n, worst(s, "error")) for n, s in results]
    return results


def run_unittest():
    """Every planned test: [(Class.method, status)]."""
    bindings = checked_assertions()
    results = []
    if run_part(set_up_module, (), False, "setUpModule", "module") != "pass":
        return [(c["class_name"] + "." + n, "error") for _, c in plan for n in sorted(c["methods"])]
    for cls, parts in plan:
        results += run_class(cls, parts, bindings)
    if run_part(tear_down_module, (), False, "tearDownModule", "module") != "pass":
        results = [(n, worst(s, "error")) for n, s in results]
    return results


def run_asserts(code, globals_dict):
    """An `assert` module, run to its end in one go: [("tests", status)]."""
    status = "error" if protected_intact() else run_part(exec_code, (code, globals_dict), False, "tests", "module")
    changed = protected_intact()
    if changed:
        report("ERROR: tests: the program changed " + changed)
        status = "error"
    return [("tests", "error" if refused else status)]


def freeze(cls):
    """Make `cls` an immutable type: setting or deleting its attributes raises TypeError."""
    cell = flag_cells[id(cls)]
    cell.value = cell.value | immutable_flag


def thaw(cls):
    cell = flag_cells[id(cls)]
    cell.value = cell.value & ~immutable_flag


# ---- the verdict ---------------------------------------------------------------------------

def escape(text):
    """`text` as the inside of a JSON string, by hand (the json module is the program's to rewrite)."""
    out = []
    for c in text:
        if c.isalnum() and c.isascii() or c in "._- :[]()":
            out.append(c)
        elif ord(c) < 0x10000:
            out.append("\\u%04x" % ord(c))
        else:
            out.append("?")
    return "".join(out)


def verdict_frame(results, loaded):
    """The length-prefixed frame of the verdict, carrying the token the program cannot read."""
    tests = ", ".join('["' + escape(n) + '", "' + s + '"]' for n, s in results)
    refusals = ", ".join('"' + escape(r[:200]) + '"' for r in refused)
    body = ('{"op": "verdict", "token": "' + token + '", "loaded": ' + ("true" if loaded else "false")
            + ', "tests": [' + tests + '], "refused": [' + refusals + ']}').encode("ascii")
    return len(body).to_bytes(4, "big") + body


def finish(results, loaded):
    """Flush the run's output, send the verdict to the host and end the process (no atexit of the program)."""
    for flush in flushes:
        try:
            flush()
        except BaseException:
            pass
    if refused:
        report("REFUSED: " + "; ".join(refused[:5]))
    data = verdict_frame(results, loaded)
    try:
        while data:
            data = data[os_write(host_fd, data):]
    except BaseException:
        pass
    os_exit(0)
