# SPDX-License-Identifier: Apache-2.0
"""Resuming a saved session into GPU memory: kvfile.torch.load against
safetensors and torch.load, hot and cold, beside the machine's own limits
(pinned host-to-device copy, a raw sequential read of the .kv bytes), in one
run. Prints one table of medians and the ratios the targets of issue 15 name.

    python3 tools/bench/torch_resume.py SESSION.kv [--dir DIR] [--repeat 5] [--cold-repeat 3]
    python3 tools/bench/torch_resume.py SESSION.kv --sweep 64,128,256 [--repeat 9]

--sweep: only hot kvfile.torch.load with each staging size (MiB), the sizes
taken in turn each round (so drift hits all alike), with the host memory of
each in a fresh process.

SESSION.kv: e.g. `kvfile synth session.kv --preset llama-3.1-8b --tokens 32768`.
DIR (default: SESSION.kv's folder) receives the bf16 exports (session.safetensors,
session.pt). Cold runs drop the file's pages first: `echo 3 >
/proc/sys/vm/drop_caches` when that works (root), else posix_fadvise(DONTNEED)
on each file; the output says which. Host memory: the peak resident set of a
fresh process during one load, above its resident set before.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import kvfile
import kvfile.torch as kvtorch


def sync():
    torch.cuda.synchronize()


def timed(fn, repeat, before=None):
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def drop_caches(paths):
    """Drops the page cache: globally if the kernel lets us, else each file's pages."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        how = "drop_caches"
    except OSError:
        how = "fadvise"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return how


def raw_read(path, block=16 << 20):
    """Sequential read of every byte of the file into one reused buffer."""
    buf = bytearray(block)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
    return total


def peak_rss_of_load(path, staging_mib=None):
    """Runs one load in a fresh process: (resident MiB before, peak MiB during)."""
    staging = "" if staging_mib is None else f"kt.STAGING_BYTES = {staging_mib} << 20\n"
    code = (
        "import sys, resource, torch, kvfile.torch as kt\n" + staging +
        "torch.zeros(1, device='cuda'); kt.load(sys.argv[1], device='cuda', stop=256)\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS'): return int(line.split()[1]) / 1024\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "before = rss()\n"
        "out = kt.load(sys.argv[1], device='cuda'); torch.cuda.synchronize()\n"
        "peak = max(before, [int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')][0])\n"
        "print(before, peak)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True, text=True)
    before, peak = map(float, out.stdout.split())
    return before, peak


def sweep(kv, sizes, repeat):
    print(f"staging sweep, hot, {kv}: median of {repeat} rounds, sizes in turn")
    raw_read(kv)
    for mib in sizes:
        kvtorch.load(kv, device="cuda", staging_bytes=mib << 20)
    times = {mib: [] for mib in sizes}
    for _ in range(repeat):
        for mib in sizes:
            kvtorch.release_staging()  # each size allocates its own buffers, once per round
            kvtorch.load(kv, device="cuda", staging_bytes=mib << 20)
            times[mib].append(timed(lambda m=mib: kvtorch.load(kv, device="cuda", staging_bytes=m << 20), 1))
    for mib in sizes:
        stats = {}
        kvtorch.load(kv, device="cuda", staging_bytes=mib << 20, stats=stats)
        before, peak = peak_rss_of_load(kv, mib)
        print(f"  staging {mib:4d} MiB: {stats['parts']:3d} parts, median {statistics.median(times[mib]):.4f} s "
              f"(min {min(times[mib]):.4f}, max {max(times[mib]):.4f}); host memory {peak - before:.0f} MiB above")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("session")
    ap.add_argument("--dir")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cold-repeat", type=int, default=3)
    ap.add_argument("--sweep")
    args = ap.parse_args()
    kv = Path(args.session)
    if args.sweep:
        sweep(kv, [int(m) for m in args.sweep.split(",")], args.repeat)
        return
    folder = Path(args.dir) if args.dir else kv.parent
    st_path, pt_path = folder / "session.safetensors", folder / "session.pt"

    import safetensors.torch as st  # noqa: PLC0415

    with kvfile.open(kv) as r:
        info = r.info()
    print(f"session: {kv} ({info['bytes'] / 1e9:.2f} GB, {info['tokens']} tokens, "
          f"{info['geometry']['layers']} layers, {info['model']})")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {os.cpu_count()} cores")
    host = kvtorch.load(kv, device="cpu")
    tensors = {k: v for k, v in host.items() if k != "tokens"}
    bf16_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if not st_path.exists():
        st.save_file(tensors, str(st_path))
    if not pt_path.exists():
        torch.save(tensors, str(pt_path))
    del host, tensors

    rows = []

    def add(name, seconds, nbytes=None):
        rate = f"{nbytes / seconds / 1e9:7.2f} GB/s" if nbytes else ""
        rows.append((name, seconds))
        print(f"  {name:<58} {seconds:8.4f} s  {rate}", flush=True)

    print(f"hot (median of {args.repeat}; files read once before):")
    for p in (kv, st_path, pt_path):
        raw_read(p)
    s_st = timed(lambda: st.load_file(str(st_path), device="cuda"), args.repeat)
    add("safetensors.torch.load_file(bf16 export, device='cuda')", s_st)
    s_pt = timed(lambda: {k: v.to("cuda") for k, v in torch.load(str(pt_path), mmap=True).items()}, args.repeat)
    add("torch.load(bf16 export, mmap=True) then .to('cuda')", s_pt)
    kvtorch.load(kv, device="cuda")  # staging buffers allocated once, as an engine keeps them
    s_kv = timed(lambda: kvtorch.load(kv, device="cuda"), args.repeat)
    add("kvfile.torch.load(device='cuda') -> bf16", s_kv, bf16_bytes)
    s_kv2 = timed(lambda: kvtorch.load(kv, device="cuda", staging_bytes=2 * kvtorch.STAGING_BYTES), args.repeat)
    add(f"  the same, staging_bytes {2 * kvtorch.STAGING_BYTES >> 20} MiB (larger parts)", s_kv2, bf16_bytes)
    with kvfile.open(kv) as r:
        s_codes = timed(lambda: r.codes_all(), args.repeat)
    add("Reader.codes_all() alone, one call, into new numpy arrays", s_codes)
    s_raw = timed(lambda: raw_read(kv), args.repeat)
    add("raw sequential read of the .kv bytes (16 MiB reads)", s_raw, info["bytes"])

    with kvfile.open(kv) as r:
        codes = r.codes_all()
    code_bytes = sum(c.nbytes + s.nbytes for c, s in codes.values())
    pinned = torch.empty(bf16_bytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(bf16_bytes, dtype=torch.uint8, device="cuda")
    s_h2d = timed(lambda: dev.copy_(pinned, non_blocking=True), args.repeat)
    add("host-to-device copy alone, bf16 bytes, pinned", s_h2d, bf16_bytes)
    s_h2d_codes = timed(lambda: dev[:code_bytes].copy_(pinned[:code_bytes], non_blocking=True), args.repeat)
    add("host-to-device copy alone, codes + scales, pinned", s_h2d_codes, code_bytes)
    del pinned, dev
    gpu_codes = {n: (torch.from_numpy(c).cuda(), torch.from_numpy(s).cuda()) for n, (c, s) in codes.items()}
    kinds = {sp["name"]: sp["dtype"] for sp in info["geometry"]["streams"]}
    tables = {k: torch.from_numpy(kvfile.fp8_decode_table(k)).cuda() for k in set(kinds.values())}
    s_deq = timed(lambda: [kvtorch.dequantize(c, s, kinds[n], torch.bfloat16, tables[kinds[n]])
                           for n, (c, s) in gpu_codes.items()], args.repeat)
    add("GPU dequantization alone (torch ops, exact)", s_deq)
    del gpu_codes, codes

    how = drop_caches([kv])
    print(f"cold (median of {args.cold_repeat}; page cache dropped before each run by {how}):")
    paths = [kv, st_path, pt_path]
    c_st = timed(lambda: st.load_file(str(st_path), device="cuda"), args.cold_repeat, lambda: drop_caches(paths))
    add("safetensors.torch.load_file, cold", c_st)
    c_pt = timed(lambda: {k: v.to("cuda") for k, v in torch.load(str(pt_path), mmap=True).items()},
                 args.cold_repeat, lambda: drop_caches(paths))
    add("torch.load(mmap=True) then .to('cuda'), cold", c_pt)
    c_kv = timed(lambda: kvtorch.load(kv, device="cuda"), args.cold_repeat, lambda: drop_caches(paths))
    add("kvfile.torch.load(device='cuda'), cold", c_kv, bf16_bytes)
    c_raw = timed(lambda: raw_read(kv), args.cold_repeat, lambda: drop_caches(paths))
    add("raw sequential read of the .kv bytes, cold", c_raw, info["bytes"])

    stats = {}
    kvtorch.load(kv, device="cuda", stats=stats)
    h2d_rate = stats["h2d_bytes"] / stats["h2d_seconds"]
    pinned_rate = code_bytes / s_h2d_codes
    before, peak = peak_rss_of_load(kv)

    print("targets (issue 15):")
    print(f"  hot: safetensors / kvfile = {s_st / s_kv:.2f}x (target >= 5x)")
    print(f"  cold: safetensors / kvfile = {c_st / c_kv:.2f}x (target >= 2x); "
          f"kvfile / raw read = {c_kv / c_raw:.3f} (target <= 1.15)")
    print(f"  H2D inside load: {h2d_rate / 1e9:.2f} GB/s over {stats['parts']} parts = "
          f"{h2d_rate / pinned_rate * 100:.0f}% of the pinned copy rate {pinned_rate / 1e9:.2f} GB/s (target >= 80%; "
          f"staging {'registered' if stats['registered'] else 'torch pinned'})")
    print(f"  host memory of load: peak {peak:.0f} MiB, {peak - before:.0f} MiB above the {before:.0f} MiB "
          f"before it (target < 512 MiB; the tensors are on the GPU)")


if __name__ == "__main__":
    main()
