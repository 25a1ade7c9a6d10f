# SPDX-License-Identifier: Apache-2.0
# Arrays the module must copy (Writer.append's stream arrays and token ids,
# mooncake_encode's values) that numpy cannot copy, or that have the wrong
# shape: a Python exception with a message naming the argument, never a dead
# interpreter, and a wrong shape refused before any copy. Each case runs in
# its own interpreter, so that a crash fails the case instead of the run.
import json
import os
import subprocess
import sys

import pytest

import kvfile

UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")

# The child's prelude. attempt(call, extra): what `call` raised, and by how
# much the peak RSS grew, with no allocation beyond `extra` bytes more than
# the interpreter holds possible during the call, whatever the kernel's
# overcommit policy (the soft address-space limit, lifted after; not under
# ASan, which reserves terabytes of address space: there its allocator
# refuses sizes above 1 TiB instead).
PRELUDE = r'''
import json, resource, sys
import numpy as np
import kvfile

def attempt(call, extra):
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if not UNDER_ASAN:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        call()
        out = {"type": None, "message": "", "value_error": False}
    except Exception as e:
        out = {"type": type(e).__name__, "message": str(e), "value_error": isinstance(e, ValueError)}
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    out["grew_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return out

GEOMETRY = {"layers": 4, "streams": [{"name": "k", "rows_per_token": 8, "row_width": 1024, "dtype": "bf16"}]}
'''


def run_child(tmp_path, body):
    """Runs PRELUDE + body in a new interpreter; returns the JSON it prints
    last, after checking that it exited normally."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    # The module this interpreter imported (PYTHONPATH may be relative).
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(kvfile.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([package_dir] + [p for p in [env.get("PYTHONPATH")] if p])
    # Under ASan an allocation it cannot serve returns NULL (numpy's
    # MemoryError) instead of aborting the process.
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1"
    code = f"UNDER_ASAN = {UNDER_ASAN}\n" + PRELUDE + body
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"the interpreter died (exit status {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# A stream array of the right shape that numpy cannot copy: 4 TiB of
# bf16 patterns as a broadcast view of one element.
APPEND_UNCOPYABLE = r'''
tokens = np.broadcast_to(np.uint32(7), (2**26,))
huge = np.broadcast_to(np.zeros((), np.uint16), (4, 2**26, 8, 1024))
with kvfile.create("a.kv", GEOMETRY, chunk_tokens=4) as w:
    out = attempt(lambda: w.append(tokens, {"k": huge}), 2 << 30)
    out["len_after"] = len(w)
    w.append([1, 2], {"k": np.ones((4, 2, 8, 1024), np.uint16)})
with kvfile.open("a.kv") as r:
    out["tokens"] = r.tokens.tolist()
print(json.dumps(out))
'''


def test_append_of_an_array_numpy_cannot_copy_raises_memory_error(tmp_path):
    out = run_child(tmp_path, APPEND_UNCOPYABLE)
    assert out["type"] == "MemoryError"
    assert out["message"] == ("stream 'k': cannot allocate 4398046511104 bytes for a contiguous copy of the "
                              "array of shape (4, 67108864, 8, 1024)")
    # Nothing was appended, and the writer goes on.
    assert out["len_after"] == 0
    assert out["tokens"] == [1, 2]


# Wrong shapes (row_width 1023 for 1024): a huge one numpy could not copy,
# and one of 1 GiB that it could. Refused before any copy: the peak RSS
# does not grow by the array's size.
APPEND_WRONG_SHAPE = r'''
tokens = np.broadcast_to(np.uint32(7), ({tokens},))
wrong = np.broadcast_to(np.zeros((), np.uint16), (4, {tokens}, 8, 1023))
with kvfile.create("a.kv", GEOMETRY) as w:
    out = attempt(lambda: w.append(tokens, {{"k": wrong}}), 2 << 30)
    out["len_after"] = len(w)
print(json.dumps(out))
'''


@pytest.mark.parametrize("tokens", [2**26, 2**14], ids=["4TiB", "1GiB"])
def test_append_of_a_wrong_shaped_broadcast_is_refused_before_copying(tmp_path, tokens):
    out = run_child(tmp_path, APPEND_WRONG_SHAPE.format(tokens=tokens))
    assert out["type"] == "ValueError"
    assert out["message"] == (f"stream 'k': shape (4, {tokens}, 8, 1023), expected "
                              f"[layers=4, tokens={tokens}, rows_per_token=8, row_width=1024]")
    assert out["len_after"] == 0
    assert out["grew_kib"] < 64 * 1024, f"the peak RSS grew by {out['grew_kib']} KiB"


# Token ids numpy cannot copy into uint32 (2**27 ids, 512 MiB, with 256 MiB
# to spare), with stream arrays of the right shape.
APPEND_UNCOPYABLE_TOKENS = r'''
tokens = np.broadcast_to(np.int64(7), (2**27,))
rows = np.broadcast_to(np.zeros((), np.uint16), (4, 2**27, 8, 1024))
with kvfile.create("a.kv", GEOMETRY) as w:
    out = attempt(lambda: w.append(tokens, {"k": rows}), 256 << 20)
    out["len_after"] = len(w)
print(json.dumps(out))
'''


@pytest.mark.skipif(UNDER_ASAN, reason="needs an address-space limit, which ASan's shadow memory rules out")
def test_append_of_token_ids_numpy_cannot_copy_raises_memory_error(tmp_path):
    out = run_child(tmp_path, APPEND_UNCOPYABLE_TOKENS)
    assert out["type"] == "MemoryError"
    assert out["message"] == ("tokens: cannot allocate 536870912 bytes for a contiguous copy of the array of "
                              "shape (134217728,)")
    assert out["len_after"] == 0


# mooncake_encode: values of a valid shape numpy cannot copy (2 TiB of
# fp16), then invalid shapes and group sizes, huge and 1 GiB.
MOONCAKE = r'''
one = np.float16(1)
cases = {
    "uncopyable": (np.broadcast_to(one, (2**40,)), 4),
    "rank 9, huge": (np.broadcast_to(one, (2,) * 8 + (2**32,)), 4),
    "rank 9, 1 GiB": (np.broadcast_to(one, (2,) * 8 + (2**21,)), 4),
    "group 0, huge": (np.broadcast_to(one, (2**40,)), 0),
}
out = {name: attempt(lambda v=v, g=g: kvfile.mooncake_encode(v, group_size=g), 2 << 30) for name, (v, g) in cases.items()}
print(json.dumps(out))
'''


def test_mooncake_encode_of_arrays_it_cannot_copy_or_take(tmp_path):
    out = run_child(tmp_path, MOONCAKE)
    assert out["uncopyable"]["type"] == "MemoryError"
    assert out["uncopyable"]["message"] == ("values: cannot allocate 2199023255552 bytes for a contiguous copy "
                                            "of the array of shape (1099511627776,)")
    for name, message in [("rank 9, huge", "rank 9 is not in 1..8"), ("rank 9, 1 GiB", "rank 9 is not in 1..8"),
                          ("group 0, huge", "group size 0")]:
        assert out[name]["type"] == "InvalidArgumentError", name
        assert out[name]["value_error"], name
        assert out[name]["message"] == message, name
        assert out[name]["grew_kib"] < 64 * 1024, f"{name}: the peak RSS grew by {out[name]['grew_kib']} KiB"
