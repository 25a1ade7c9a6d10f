# SPDX-License-Identifier: Apache-2.0
"""load_into's layer 0 against issue 32's target (ready after at most 2/32 of
the time to the last layer), before and after the reader kept its worker
threads and load_into took an open reader, alternated in one process on one
file. Run by tools/bench/gpu_layer0.sh.

    python3 tools/bench/gpu_layer0.py DIR [--tokens 32768] [--rounds 7]

DIR: scratch space (~2.5 GB). The session is a llama-3.1-8b cache (32 layers,
k and v of 8 heads x 128) of random bf16 values made on the GPU, saved e4m3
(kvfile.torch.save). Each round runs every variant once, in turn:

- before: load_into(path), layer 0 in one slice, each part read after the
  one before was queued (FIRST_LAYER_SLICES = 1, READ_AHEAD = False): the
  code before this change (the reader's threads then were started by every
  read call; with one slice that is one start in either tree);
- path, N slices: load_into(path), layer 0 in N token slices, parts read
  ahead (the reader's threads started by the first slice, kept for the rest);
- reader, N slices: load_into(reader), a reader kvfile.open gave once and
  that has read before (threads and file handles kept; no open, no scan).

The figure is the GPU's timeline: from an event recorded at the call to
layer 0's event, over the time to the last layer's event (medians of the
rounds). load(path) runs in every round too, for load_into / load (issue 32:
at most 1.15).
"""
import argparse
import os
import statistics
import time
from pathlib import Path

import torch

import kvfile
import kvfile.torch as kvtorch

LAYERS, HEADS, DIM, BLOCK = 32, 8, 128, 16
TARGET = 2 / LAYERS


def main():
    t_begin = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    n = args.tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(LAYERS, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(LAYERS, n, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    path = d / "session.kv"
    kvtorch.save(path, {"k": k, "v": v}, torch.arange(n), dtype="e4m3", overwrite=True)
    del k, v
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {os.cpu_count()} cores; "
          f"{path.stat().st_size / 1e9:.2f} GB e4m3 file of {n} tokens x {LAYERS} layers x (k, v) of "
          f"{HEADS} x {DIM} (made in {time.perf_counter() - t_begin:.1f} s)")

    blocks = n // BLOCK
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(1))
    dest = [torch.empty(2, blocks, BLOCK, HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    reader = kvfile.open(path)

    def variant(source, slices, ahead):
        def call():
            kvtorch.FIRST_LAYER_SLICES, kvtorch.READ_AHEAD = slices, ahead
            return kvtorch.load_into(reader if source == "reader" else path, dest, block_ids=order)
        return call
    variants = {"before: path, 1 slice, no read-ahead": variant("path", 1, False)}
    for slices in (1, 2, 4):
        variants[f"path, {slices} slice{'s' * (slices > 1)}"] = variant("path", slices, True)
    for slices in (1, 2, 4, 8):
        variants[f"reader, {slices} slice{'s' * (slices > 1)}"] = variant("reader", slices, True)

    def timed(call):
        """(layer 0's time, the last layer's, the call's wall time), seconds."""
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        events = call()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return start.elapsed_time(events[0]) / 1e3, start.elapsed_time(events[-1]) / 1e3, wall

    def load():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kvtorch.load(path, device="cuda")
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    # Warm: the page cache, the staging, the reader's threads and handles.
    load()
    for call in variants.values():
        call()
    results = {name: [] for name in variants}
    loads = []
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        loads.append(load())
        for name, call in variants.items():
            results[name].append(timed(call))
    print(f"{args.rounds} rounds, every variant once a round, in turn ({time.perf_counter() - t0:.1f} s); "
          f"medians; load(path) {statistics.median(loads) * 1e3:.1f} ms")

    # Each variant's destination equals load's tensors.
    want = kvtorch.load(path, device="cuda")
    t = torch.arange(n, device="cuda")
    blk, off = order.cuda()[t // BLOCK], t % BLOCK
    for name, call in variants.items():
        for x in dest:
            x.fill_(0)
        call()
        torch.cuda.synchronize()
        assert all(torch.equal(dest[i][0, blk, off], want["k"][i]) and torch.equal(dest[i][1, blk, off], want["v"][i])
                   for i in range(LAYERS)), f"{name}: load_into differs from load"
    print("every variant's destination equals load's tensors (every layer, k and v)")
    reader.close()

    print(f"{'variant':<38} {'layer 0':>8} {'last':>8} {'fraction':>9} {'/ 2/32':>7} {'call':>8} {'/ load':>7}")
    summary = {}
    for name, runs in results.items():
        fractions = [a / b for a, b, _ in runs]
        f = statistics.median(fractions)
        wall = statistics.median(w for _, _, w in runs)
        summary[name] = f
        print(f"{name:<38} {statistics.median(a for a, _, _ in runs) * 1e3:6.1f} ms "
              f"{statistics.median(b for _, b, _ in runs) * 1e3:6.1f} ms {f:9.4f} {f / TARGET:7.3f} "
              f"{wall * 1e3:6.1f} ms {wall / statistics.median(loads):7.3f}  (fraction min {min(fractions):.4f}, "
              f"max {max(fractions):.4f})")
    before = summary.pop("before: path, 1 slice, no read-ahead")
    best = min(summary, key=summary.get)
    print(f"target (issue 32): layer 0 at <= 2/{LAYERS} = {TARGET:.4f} of the time to the last layer")
    print(f"  before: {before:.4f} ({before / TARGET:.3f}x the target)")
    print(f"  after, best ({best}): {summary[best]:.4f} ({summary[best] / TARGET:.3f}x the target; "
          f"{'met' if summary[best] <= TARGET else 'missed'}); layer 0 {before / summary[best]:.2f}x sooner "
          "as a fraction")
    print(f"total {time.perf_counter() - t_begin:.1f} s")


if __name__ == "__main__":
    main()
