import json, sys, collections, subprocess, time
from reward.fleet import Fleet
from reward.sandbox import Job, Limits
from reward.schema import UnittestTests
rs = [json.loads(l) for l in open("/work/shared/data/bigcodebench_pdb200.jsonl")]
jobs = [Job(r["complete_prompt"] + r["canonical_solution"], UnittestTests(r["test"]), Limits(timeout_s=60, memory_mb=2048)) for r in rs]
t = time.time()
with Fleet(workers=2, cache=False) as f:
    res = f.run(jobs)
print("harness:", collections.Counter(r.status for r in res), "%.0f s" % (time.time() - t))
bad = [(rs[i], r) for i, r in enumerate(res) if r.status != "pass"]
out = []
for rec, r in bad:
    prog = rec["complete_prompt"] + rec["canonical_solution"] + "\n" + rec["test"] + "\nimport unittest, sys\nres = unittest.TextTestRunner(stream=sys.stderr).run(unittest.TestLoader().loadTestsFromModule(sys.modules[__name__]))\nsys.exit(0 if res.wasSuccessful() else 1)\n"
    try:
        p = subprocess.run([sys.executable, "-c", prog], capture_output=True, timeout=60, cwd="/tmp")
        plain = p.returncode == 0
    except subprocess.TimeoutExpired:
        plain = False
    out.append({"id": rec["task_id"], "status": r.status, "plain_pass": plain, "libs": rec["libs"], "why": (r.stderr or "")[-400:]})
json.dump(out, open("/tmp/bcb_harness.json", "w"), indent=1)
print("not passing in the harness:", len(out), "of which pass in plain python:", sum(o["plain_pass"] for o in out))
