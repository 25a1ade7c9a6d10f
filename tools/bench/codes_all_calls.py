# SPDX-License-Identifier: Apache-2.0
"""The cost of one small Reader.codes_all call, the read load_into makes for
each token slice of layer 0: median of many calls on one open reader, with
the file in the page cache.

    python3 tools/bench/codes_all_calls.py DIR [--calls 100] [--rounds 5] [--before PYTHONPATH]

DIR: scratch space (~40 MB). The file: 4 layers, k and v of 8 x 128 e4m3,
4,096 tokens in chunks of 128 (32 chunks). The calls, each into buffers made
beforehand:
- one chunk of layer 0 (one worker: the calling thread);
- 16 chunks of layer 0 on the calling thread alone (the floor);
- 16 chunks of layer 0 on 16 workers (15 reader threads, each reading
  through a handle of the file of its own);
- 16 chunks of layer 0 on every core (threads=0, as load_into asks).
Each round runs the calls in a process of their own: this tree's module (the
PYTHONPATH this script runs with), then, with --before PYTHONPATH, the module
of another tree built the same way; the medians are over every call of every
round, printed side by side with the ratios before / after.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import kvfile

LAYERS, HEADS, DIM, TOKENS, CHUNK = 4, 8, 128, 4096, 128
CASES = {"one chunk, 1 worker": (1, 1), "16 chunks, 1 worker": (16, 1), "16 chunks, 16 workers": (16, 16),
         "16 chunks, threads=0": (16, 0)}


def make(path):
    geometry = {"layers": LAYERS, "streams": [{"name": name, "rows_per_token": HEADS, "row_width": DIM,
                                               "dtype": "e4m3"} for name in ("k", "v")]}
    rng = np.random.default_rng(0)
    with kvfile.create(str(path), geometry, chunk_tokens=CHUNK) as w:
        for at in range(0, TOKENS, 1024):
            rows = {name: rng.standard_normal((LAYERS, 1024, HEADS, DIM), dtype=np.float32) for name in ("k", "v")}
            w.append(np.arange(at, at + 1024, dtype=np.uint32), rows)


def measure(path, calls):
    """{case: [seconds of each call]}."""
    out = {}
    with kvfile.open(str(path)) as reader:
        for case, (chunks, threads) in CASES.items():
            n = chunks * CHUNK
            bufs = {name: (np.empty((1, n, HEADS, DIM), np.uint8), np.empty((1, n, HEADS), np.float32))
                    for name in ("k", "v")}
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                reader.codes_all(stop=n, threads=threads, layers=(0, 1), out=bufs)
                times.append(time.perf_counter() - t0)
            out[case] = times
    return out


def run(d, calls, pythonpath):
    """measure() in a new process with `pythonpath`."""
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run([sys.executable, __file__, str(d), "--calls", str(calls), "--json"], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", help="PYTHONPATH of the tree to compare with (its kvfile module)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "calls.kv"
    if args.json:
        print(json.dumps(measure(path, args.calls)))
        return
    if not path.exists():
        make(path)
    trees = {"after": os.environ.get("PYTHONPATH", "")}
    if args.before:
        trees["before"] = args.before
    times = {tree: {case: [] for case in CASES} for tree in trees}
    for _ in range(args.rounds):
        for tree, pythonpath in trees.items():
            for case, t in run(d, args.calls, pythonpath).items():
                times[tree][case] += t
    print(f"codes_all of layer 0 on one open reader, median of {args.rounds} rounds x {args.calls} calls, the trees "
          f"alternated ({os.cpu_count()} cores; after: {Path(kvfile.__file__).parent}):")
    for case in CASES:
        after = statistics.median(times["after"][case])
        line = f"  {case:<24} after {after * 1e3:8.3f} ms"
        if args.before:
            before = statistics.median(times["before"][case])
            line += f"   before {before * 1e3:8.3f} ms   before / after {before / after:6.2f}"
        print(line)


if __name__ == "__main__":
    main()
