"""Benchmark the demo's SFT step with the CPU split into 1 device and into N (the demo's split).

Each measurement is a fresh process (XLA reads the device count when JAX
starts) that trains the default demo policy on default-sized SFT pairs for
--steps steps and reports the median seconds of a step after --warmup steps.
The settings alternate (1, N, 1, N, ...) for --repeats rounds, so machine load
hits both alike; the ratio is N-device time over 1-device time, from the
medians over rounds. Prints a table, or with --json one JSON object.

    scripts/bench_demo_sft.py [--devices 2] [--steps 40] [--repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, os, sys, time
import numpy as np
import jax
from jaxrl.demo import domain, sft
from jaxrl.demo.policy import new_policy, policy_config
from jaxrl.demo.run import DemoConfig
from jaxrl.demo.tokenizer import load_demo_tokenizer

steps, warmup = int(sys.argv[1]), int(sys.argv[2])
d = DemoConfig()
tok = load_demo_tokenizer()
pairs, _ = sft.sft_pairs(domain.make_splits(0, 512, 1, 1, 1, d.domain).sft, d.sft.rewrite_share, 0, d.sft.miss_share)
tokens, mask = sft.encode_pairs(tok, pairs)
model = new_policy(policy_config(tok, d.hidden, d.layers, d.heads), 0)
stamps = []
cfg = sft.SFTConfig(steps=steps, batch_size=d.sft.batch_size, warmup_steps=1)
sft.train_sft(model, tokens, mask, cfg, 0, lambda i, loss: stamps.append(time.perf_counter()))
gaps = np.diff(stamps)[warmup:]
print(json.dumps({"devices": len(jax.devices()), "step_s": float(np.median(gaps)), "tokens": list(tokens.shape)}))
"""


def measure(devices: int, steps: int, warmup: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    out = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(warmup)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2, help="the split to compare with one device (default 2)")
    parser.add_argument("--steps", type=int, default=40, help="SFT steps per measurement (default 40)")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the median (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of (1, N) measurements (default 2)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if args.devices < 2 or args.repeats < 1 or not 0 <= args.warmup < args.steps - 1:
        print("bench_demo_sft: need --devices >= 2, --repeats >= 1 and 0 <= --warmup < --steps - 1", file=sys.stderr)
        return 2
    times: dict[int, list[float]] = {1: [], args.devices: []}
    for _ in range(args.repeats):
        for n in times:
            result = measure(n, args.steps, args.warmup)
            if result["devices"] != n:
                print(f"bench_demo_sft: asked for {n} CPU devices, JAX made {result['devices']}", file=sys.stderr)
                return 1
            times[n].append(result["step_s"])
    medians = {n: statistics.median(v) for n, v in times.items()}
    summary = {"steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "cores": os.cpu_count(),
               "load_average": os.getloadavg(), "step_s": {str(n): v for n, v in times.items()},
               "median_step_s": {str(n): m for n, m in medians.items()},
               "ratio": medians[args.devices] / medians[1]}
    if args.json:
        print(json.dumps(summary))
        return 0
    print("| CPU devices | SFT step (median of rounds) | each round |")
    print("|---|---|---|")
    for n, m in medians.items():
        print(f"| {n} | {m * 1000:.0f} ms | {', '.join(f'{t * 1000:.0f}' for t in times[n])} ms |")
    print(f"\n{args.devices} devices take {summary['ratio']:.2f}x the time of 1 ({os.cpu_count()} cores, "
          f"load average {summary['load_average'][0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
