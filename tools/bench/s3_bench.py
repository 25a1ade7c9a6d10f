#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 30's object-storage figures, side by side in one run against one
local store (OpenStack Swift with s3api, tests/support/swift_store.py):

  - a remote .kv read with every checksum checked (`kvfile verify s3://...`)
    against the same bytes fetched by parallel ranged GETs with curl
    (--aws-sigv4, PARALLEL ranges of 8 MiB in flight): the store's limit;
  - `kvfile pack DIR -o s3://...` against `aws s3 cp` (Debian's awscli) of
    a file of the pack's size;
  - `kvfile find` on a remote pack of MEMBERS members;
  - each command's peak memory (max RSS) and the requests it made, counted
    at the store (client requests; the store's own subrequests not counted).

Medians of REPS runs, each pair compared run in turn (curl, verify, curl,
...); ratios of medians measured in this run.

    tools/bench/s3_bench.py [--tokens 2048] [--sessions 4] [--members 100000] [--reps 3]
                            [--kvfile build/kvfile] [--find-bench build/find_bench]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import swift_store  # noqa: E402

AWS = "/usr/bin/aws"
PARALLEL = 8
RANGE_BYTES = 8 << 20


def run(cmd, env, store=None):
    """Runs `cmd`; (seconds, peak RSS in MiB, requests made or None)."""
    before = store.requests() if store else None
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.monotonic() - t0
    err = p.stderr.read().decode()
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit("s3_bench: %s failed (%d): %s" % (" ".join(cmd), p.returncode, err.strip()))
    requests = None
    if store:
        after = store.requests()
        requests = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    return seconds, usage.ru_maxrss / 1024, requests


def summary(results):
    """(median seconds, max peak RSS, the last run's requests) of runs."""
    return statistics.median(r[0] for r in results), max(r[1] for r in results), results[-1][2]


def median_run(cmd, env, store, reps):
    return summary([run(cmd, env, store) for _ in range(reps)])


def alternated(cmds, env, store, reps):
    """Each command's summary, the commands run in turn REPS times (a load
    that comes and goes on the machine falls on all of them alike)."""
    results = [[] for _ in cmds]
    for _ in range(reps):
        for i, cmd in enumerate(cmds):
            results[i].append(run(cmd, env, store))
    return [summary(r) for r in results]


def curl_ranges(store, url, size, write_out=False):
    """curl, PARALLEL ranged GETs in flight, every range of the object: one
    transfer each, its options after --next (without it curl gives every
    transfer the last -r); with write_out, each prints its bytes."""
    cmd = ["curl", "-s", "--parallel", "--parallel-max", str(PARALLEL)]
    for start in range(0, size, RANGE_BYTES):
        if start:
            cmd.append("--next")
        cmd += ["-s", "-f"] + store.curl_args() + ["-r", "%d-%d" % (start, min(size, start + RANGE_BYTES) - 1),
                                                   "-o", "/dev/null", url]
        if write_out:
            cmd += ["-w", "%{size_download}\\n"]
    return cmd


def check_curl_bytes(store, url, size, env):
    """Exits unless the curl command fetches exactly the object's bytes."""
    out = subprocess.run(curl_ranges(store, url, size, True), env=env, check=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    got = sum(int(n) for n in out.split())
    if got != size:
        sys.exit("s3_bench: curl fetched %d bytes of a %d-byte object" % (got, size))


def fmt_requests(r):
    return ", ".join("%s %d" % (k, v) for k, v in sorted(r.items()) if k != "total") if r else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per session (llama-3.1-8b, e4m3)")
    ap.add_argument("--sessions", type=int, default=4, help="sessions packed")
    ap.add_argument("--members", type=int, default=100000, help="members of the pack find runs on")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kvfile", default=os.path.join(ROOT, "build", "kvfile"))
    ap.add_argument("--find-bench", default=os.path.join(ROOT, "build", "find_bench"))
    a = ap.parse_args()
    kv = a.kvfile
    work = tempfile.mkdtemp(prefix="kvfile-s3-bench-")
    store = swift_store.Harness(work)
    try:
        env = store.env()
        bucket = store.bucket("bench")
        s3 = "s3://%s/" % bucket
        rows = []
        print("store ready in %.1f s" % store.ready_seconds, flush=True)

        # One session: remote read, every checksum checked, vs curl.
        one = os.path.join(work, "one.kv")
        subprocess.run([kv, "synth", one, "--preset", "llama-3.1-8b", "--tokens", str(a.tokens)], check=True,
                       stdout=subprocess.DEVNULL)
        size = os.path.getsize(one)
        subprocess.run([AWS, "--endpoint-url", store.endpoint, "s3", "cp", one, s3 + "one.kv"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        check_curl_bytes(store, store.endpoint + "/%s/one.kv" % bucket, size, env)
        curl, verify = alternated([curl_ranges(store, store.endpoint + "/%s/one.kv" % bucket, size),
                                   [kv, "verify", s3 + "one.kv"]], env, store, a.reps)
        info = run([kv, "info", s3 + "one.kv"], env, store)
        rows.append(("curl, %d ranged GETs in flight (%.0f MiB)" % (PARALLEL, size / 2**20), curl, size))
        rows.append(("kvfile verify s3://.../one.kv", verify, size))
        rows.append(("kvfile info s3://.../one.kv", info, None))

        # A corpus of sessions sharing a prefix: pack -o s3:// vs aws s3 cp.
        corpus = os.path.join(work, "corpus")
        os.mkdir(corpus)
        for i in range(a.sessions):
            subprocess.run([kv, "synth", os.path.join(corpus, "s%03d.kv" % i), "--preset", "llama-3.1-8b",
                            "--tokens", str(a.tokens), "--seed", str(i + 1), "--prefix-tokens", str(a.tokens // 2)],
                           check=True, stdout=subprocess.DEVNULL)
        local_pack = os.path.join(work, "c.kvpack")
        subprocess.run([kv, "pack", corpus, "-o", local_pack], check=True, stdout=subprocess.DEVNULL)
        pack_size = os.path.getsize(local_pack)
        awscp, pack = alternated([[AWS, "--endpoint-url", store.endpoint, "s3", "cp", local_pack, s3 + "aws.kvpack"],
                                  [kv, "pack", corpus, "-o", s3 + "c.kvpack", "--force"]], env, store, a.reps)
        rows.append(("aws s3 cp c.kvpack (%.0f MiB)" % (pack_size / 2**20), awscp, pack_size))
        rows.append(("kvfile pack DIR -o s3://.../c.kvpack", pack, pack_size))
        member = run([kv, "unpack", s3 + "c.kvpack", "-o", os.path.join(work, "un"), "s000.kv"], env, store)
        rows.append(("kvfile unpack s3://.../c.kvpack s000.kv", member, None))

        # find on a remote pack of --members members: tiny sessions in 100
        # families sharing a 32-token prefix (find_bench make), packed.
        many = os.path.join(work, "many")
        t0 = time.monotonic()
        subprocess.run([a.find_bench, "make", many, str(a.members)], check=True, stdout=subprocess.DEVNULL)
        big = os.path.join(work, "many.kvpack")
        subprocess.run([kv, "pack", many, "-o", big], check=True, stdout=subprocess.DEVNULL)
        query = os.path.join(work, "query.txt")
        subprocess.run([a.find_bench, "query", many, query], check=True, stdout=subprocess.DEVNULL)
        shutil.rmtree(many)
        made = time.monotonic() - t0
        subprocess.run([AWS, "--endpoint-url", store.endpoint, "s3", "cp", big, s3 + "many.kvpack"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
        find = median_run([kv, "find", s3 + "many.kvpack", "--tokens", query], env, store, a.reps)
        rows.append(("kvfile find s3://.../many.kvpack (%d members, %.0f MiB)" % (a.members,
                                                                                os.path.getsize(big) / 2**20),
                     find, None))

        print("\n| operation | median s | MB/s | peak RSS MiB | requests |")
        print("|---|---:|---:|---:|---|")
        for name, (sec, rss, req), nbytes in rows:
            rate = "%.0f" % (nbytes / sec / 1e6) if nbytes else "-"
            print("| %s | %.3f | %s | %.0f | %s (%d) |" % (name, sec, rate, rss, fmt_requests(req),
                                                        req.get("total", 0) if req else 0))
        print("\nremote verify / curl ranged GETs: %.2fx" % (curl[0] / verify[0]))
        print("pack -o s3:// / aws s3 cp: %.2fx" % (awscp[0] / pack[0]))
        print("(the %d-member pack took %.0f s to make)" % (a.members, made))
    finally:
        store.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
