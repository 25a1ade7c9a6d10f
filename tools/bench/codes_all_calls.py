# SPDX-License-Identifier: Apache-2.0
"""The cost of one small Reader.codes_all call, the read load_into makes for
each token slice of layer 0: median of many calls on one open reader, with
the file in the page cache.

    python3 tools/bench/codes_all_calls.py DIR [--calls 300] [--before PYTHONPATH]

DIR: scratch space (~40 MB). The file: 4 layers, k and v of 8 x 128 e4m3,
4,096 tokens in chunks of 128 (32 chunks). The calls, each into buffers made
beforehand:
- one chunk of layer 0 (one worker: the calling thread);
- 16 chunks of layer 0 on 16 workers (15 reader threads, each reading
  through a handle of the file of its own);
- 16 chunks of layer 0 on every core (threads=0, as load_into asks).
--before PYTHONPATH: also runs this script with that PYTHONPATH (the Python
module of another tree, built the same way) and prints its medians beside
these, with the ratios before / after.
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
CASES = {"one chunk, 1 worker": (1, 1), "16 chunks, 16 workers": (16, 16), "16 chunks, threads=0": (16, 0)}


def make(path):
    geometry = {"layers": LAYERS, "streams": [{"name": name, "rows_per_token": HEADS, "row_width": DIM,
                                               "dtype": "e4m3"} for name in ("k", "v")]}
    rng = np.random.default_rng(0)
    with kvfile.create(str(path), geometry, chunk_tokens=CHUNK) as w:
        for at in range(0, TOKENS, 1024):
            rows = {name: rng.standard_normal((LAYERS, 1024, HEADS, DIM), dtype=np.float32) for name in ("k", "v")}
            w.append(np.arange(at, at + 1024, dtype=np.uint32), rows)


def measure(path, calls):
    """{case: median seconds of a call}."""
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
            out[case] = statistics.median(times)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--before", help="PYTHONPATH of the tree to compare with (its kvfile module)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / "calls.kv"
    if not path.exists():
        make(path)
    after = measure(path, args.calls)
    if args.json:
        print(json.dumps(after))
        return
    before = None
    if args.before:
        env = dict(os.environ, PYTHONPATH=args.before, PYTHONDONTWRITEBYTECODE="1")
        done = subprocess.run([sys.executable, __file__, str(d), "--calls", str(args.calls), "--json"], env=env,
                              check=True, capture_output=True, text=True)
        before = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"codes_all of layer 0, median of {args.calls} calls on one open reader ({os.cpu_count()} cores, "
          f"kvfile from {Path(kvfile.__file__).parent}):")
    for case, t in after.items():
        line = f"  {case:<24} {t * 1e3:8.3f} ms"
        if before:
            line += f"   before {before[case] * 1e3:8.3f} ms   before / after {before[case] / t:6.2f}"
        print(line)


if __name__ == "__main__":
    main()
