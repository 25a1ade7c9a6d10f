#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Figures for kvfile llama-server save (docs/llama.md, "llama-server
sessions"): per turn, the bytes written and the wall time of
`kvfile llama-server save` (the server's own save into a temporary file,
the import, the append) against llama-server's own save of the same slot
(one slot file per turn), for a history of H tokens followed by 10 turns of
T prompt tokens and N_PREDICT generated ones; then the .kv after the 10
turns against the 10 slot files.

llama-server's own save does not fsync; the figures give its time with an
fsync of the slot file too (kvfile's append is durable when it returns).

usage: KVFILE_CLI=build/kvfile PYTHONPATH=build/python \\
       llama_server_bench.py [H ...]      (default: 2000 20000)
The server and the model are those of tests/llama_server (the cache of
scripts/llama_server_build.sh).
"""
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "llama_server"))
import test_llama_server as t  # noqa: E402  (Server, make_model, http)

TURNS, T_PROMPT = 10, 50


def run(h, work, model, dtype):
    slots = work / f"slots-{h}-{dtype or 'raw'}"
    s = t.Server(model, slots, "-c", str(h + TURNS * (T_PROMPT + t.N_PREDICT) + 64), "-b", "2048")
    try:
        rng = random.Random(h)
        history = [rng.randrange(259, 326) for _ in range(h)]
        s.complete(history)
        kv = work / f"chat-{h}-{dtype or 'raw'}.kv"
        rows = []
        for turn in range(TURNS):
            history = history + [rng.randrange(259, 326) for _ in range(T_PROMPT)]
            gen = s.complete(history)[0]
            history = history + gen
            t0 = time.monotonic()
            own = t.http(s.url + "/slots/0?action=save", {"filename": f"turn{turn}.bin"})
            t_own = time.monotonic() - t0
            fd = os.open(slots / f"turn{turn}.bin", os.O_RDONLY)  # made durable, as kvfile's append is
            os.fsync(fd)
            os.close(fd)
            t_own_sync = time.monotonic() - t0
            before = kv.stat().st_size if kv.exists() else 0
            args = [t.KVFILE, "--quiet", "llama-server", "save", s.url, "0", str(kv), "--slot-dir", str(slots),
                    "--head-size", "64"] + (["--dtype", dtype] if dtype else [])
            t0 = time.monotonic()
            subprocess.run(args, check=True, capture_output=True)
            t_kv = time.monotonic() - t0
            rows.append((turn, own["n_saved"], own["n_written"], t_own, kv.stat().st_size - before, t_kv, t_own_sync))
        slot_total = sum((slots / f"turn{i}.bin").stat().st_size for i in range(TURNS))
        return rows, kv.stat().st_size, slot_total
    finally:
        s.stop()


def main():
    hs = [int(x) for x in sys.argv[1:]] or [2000, 20000]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = t.make_model(work / "tiny-vocab.gguf", "--ctx", "32768")
        for h in hs:
            for dtype in (None, "e4m3"):
                rows, kv_size, slot_total = run(h, work, model, dtype)
                later = rows[1:]  # turn 0 creates the .kv (the whole history)
                print(f"history {h} tokens, .kv {dtype or 'raw f16'}: turn 0 (creates the .kv): server "
                      f"{rows[0][2]} B {rows[0][3]:.3f} s ({rows[0][6]:.3f} s with fsync), kvfile {rows[0][4]} B "
                      f"{rows[0][5]:.3f} s")
                print(f"  turns 1-9, median per turn: server save {statistics.median(r[2] for r in later):.0f} B "
                      f"in {statistics.median(r[3] for r in later):.3f} s "
                      f"({statistics.median(r[6] for r in later):.3f} s with fsync); kvfile save "
                      f"{statistics.median(r[4] for r in later):.0f} B in "
                      f"{statistics.median(r[5] for r in later):.3f} s")
                print(f"  after 10 turns ({rows[-1][1]} tokens): .kv {kv_size} B; 10 slot files {slot_total} B "
                      f"({slot_total / kv_size:.1f}x)")
                sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
