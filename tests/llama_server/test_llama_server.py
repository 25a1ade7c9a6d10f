# SPDX-License-Identifier: Apache-2.0
"""kvfile llama-server save|restore against a real llama-server (llama.cpp
v0.5.0 from node-llama-cpp 3.22.1, built by scripts/llama_server_build.sh)
serving a tiny random-weight model with a vocabulary
(tools/llama_roundtrip/make_model.py --vocab). Each server listens on
127.0.0.1 only, is waited for with a bound, and is stopped by the test.

Run by ctest as llama_server (KVFILE_CLI: the kvfile command;
KVFILE_LLAMA_CACHE: the llama.cpp cache directory; PYTHONPATH: the build's
kvfile package).
"""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KVFILE_LLAMA_CACHE") or
             Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvfile" / "llama")
SERVER = CACHE / "llama.cpp" / "build" / "bin" / "llama-server"
GGUF_PY = CACHE / "llama.cpp" / "gguf-py"
KVFILE = os.environ.get("KVFILE_CLI", "")

MISSING = not SERVER.exists() or not KVFILE
if MISSING and os.environ.get("KVFILE_REQUIRE_LLAMA_SERVER") == "1":
    raise RuntimeError(f"KVFILE_REQUIRE_LLAMA_SERVER=1 but {SERVER} (scripts/llama_server_build.sh) or KVFILE_CLI "
                       "is missing")
pytestmark = pytest.mark.skipif(MISSING, reason=f"needs {SERVER} (scripts/llama_server_build.sh) and KVFILE_CLI")

import kvfile  # noqa: E402
import kvfile.llama_server as ls  # noqa: E402

# Turns of the conversation: token ids of the model's words (259..325),
# each answered with N_PREDICT greedy tokens.
TURNS = [[260, 270, 280, 290, 300, 310, 320, 265, 275, 285], [261, 271, 281], [262, 272, 282, 292, 302],
         [263, 273, 283, 293]]
N_PREDICT = 8


def make_model(path, *extra):
    subprocess.run([sys.executable, str(ROOT / "tools/llama_roundtrip/make_model.py"), str(GGUF_PY), str(path),
                    "--vocab", *extra], check=True)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {"tiny": make_model(d / "tiny-vocab.gguf"), "other": make_model(d / "other-vocab.gguf", "--seed", "20")}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """One llama-server on 127.0.0.1 with a slot directory; stopped by stop()."""

    def __init__(self, model, slot_dir, *flags):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.slot_dir = Path(slot_dir)
        self.slot_dir.mkdir(parents=True, exist_ok=True)
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [str(SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-c", "1024", "-np",
             "1", "-t", "2", "--slot-save-path", str(self.slot_dir), "--no-webui", "--no-warmup", *flags],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:  # bounded: the server answers /health once the model is loaded
            assert self.proc.poll() is None, self.output()
            try:
                if http(self.url + "/health", timeout=2).get("status") == "ok":
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server did not start in 120 s"
            time.sleep(0.05)

    def output(self):
        self.log.seek(0)
        return self.log.read()[-3000:]

    def complete(self, prompt, slot=0):
        r = http(self.url + "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "seed": 7,
                                            "cache_prompt": True, "id_slot": slot, "n_probs": 4,
                                            "return_tokens": True})
        # None when the server withholds them (it does while the text ends
        # inside a UTF-8 sequence: byte tokens).
        probs = [[(p["id"], p["logprob"]) for p in t["top_logprobs"]] for t in r["completion_probabilities"]] \
            if "completion_probabilities" in r else None
        return r["tokens"], probs, r["timings"]["prompt_n"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def servers():
    started = []

    def start(*args):
        s = Server(*args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def cli(*args):
    return subprocess.run([KVFILE, "--quiet", *map(str, args)], capture_output=True, text=True, timeout=300)


def leftovers(d):
    return sorted(p.name for p in Path(d).iterdir() if p.name.startswith("kvfile-tmp-"))


def digest(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def converse(server, turns, after_turn=None):
    """Runs the turns; returns the history (prompt and generated tokens) and
    the last turn's (tokens, probs, prompt tokens evaluated)."""
    history, last = [], None
    for i, t in enumerate(turns):
        history = history + t
        last = server.complete(history)
        history = history + last[0]
        if after_turn:
            after_turn(i, history)
    return history, last


def test_multi_turn_save_restore_continues_exactly(models, servers, tmp_path):
    # The uninterrupted reference.
    ref = servers(models["tiny"], tmp_path / "ref")
    _, ref_last = converse(ref, TURNS)
    ref.stop()

    a = servers(models["tiny"], tmp_path / "a")
    kv, kv8 = tmp_path / "chat.kv", tmp_path / "chat-e4m3.kv"
    appended, sizes = [], []

    def save(i, history):
        out = ls.save(a.url, 0, kv, a.slot_dir)  # the head size from the served model
        appended.append(out)
        sizes.append(kv.stat().st_size)
        assert leftovers(a.slot_dir) == []
        with kvfile.open(str(kv)) as r:
            # the slot holds every token but the last generated one
            assert list(r.tokens) == history[:-1]

    history, _ = converse(a, TURNS[:-1], save)
    # Turn 1 created the file; every later save appended that turn's tokens only.
    n = [len(TURNS[0]) + N_PREDICT - 1]
    for t in TURNS[1:-1]:
        n.append(len(t) + N_PREDICT)
    assert appended[0].startswith(f"{kv}: created with {n[0]} tokens from slot 0 of {a.url} (")
    for i in (1, 2):
        assert appended[i].startswith(f"{kv}: appended {n[i]} tokens from slot 0 of {a.url} ({sum(n[:i + 1])} "
                                      f"tokens in total; file +"), appended[i]
    # Saving again without a new turn appends nothing.
    assert ls.save(a.url, 0, kv, a.slot_dir, head_size=64).startswith(f"{kv}: up to date ({sum(n)} tokens)")
    assert kv.stat().st_size == sizes[-1]
    ls.save(a.url, 0, kv8, a.slot_dir, dtype="e4m3", head_size=64)
    a.stop()

    # A fresh server: restore, then the last turn evaluates its own tokens
    # only, and continues exactly as the uninterrupted server did.
    b = servers(models["tiny"], tmp_path / "b")
    out = ls.restore(b.url, 0, kv, b.slot_dir)
    assert out.startswith(f"{kv}: restored {sum(n)} tokens into slot 0 of {b.url} (")
    assert leftovers(b.slot_dir) == []
    tokens, probs, evaluated = b.complete(history + TURNS[-1])
    assert evaluated == len(TURNS[-1]) + 1  # the turn, and the last generated token of the turn before
    assert tokens == ref_last[0]
    assert ref_last[1]  # the server gave probabilities (for the tokens whose text is complete)
    assert probs == ref_last[1]
    b.stop()

    # e4m3, from a pack member: restored and continued; the agreement with
    # the reference is reported (docs/llama.md gives the figures).
    pack = tmp_path / "chats.kvpack"
    p = subprocess.run([KVFILE, "--quiet", "pack", kv8.name, "-o", str(pack)], cwd=tmp_path, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    member = f"{pack}:{kv8.name}"
    c = servers(models["tiny"], tmp_path / "c")
    assert ls.restore(c.url, 0, member, c.slot_dir).startswith(f"{member}: restored {sum(n)} tokens")
    tokens8, probs8, evaluated8 = c.complete(history + TURNS[-1])
    assert evaluated8 == len(TURNS[-1]) + 1
    same = next((i for i, (x, y) in enumerate(zip(tokens8, ref_last[0])) if x != y), len(tokens8))
    dp = max(abs(p[1] - q[1]) for pa, qa in zip(probs8, ref_last[1]) for p, q in zip(pa, qa))
    print(f"e4m3: greedy agreement {same}/{len(tokens8)}, max |d logprob| of the top 4 {dp:.3g}")
    (tmp_path.parent / "llama_server_e4m3.txt").write_text(f"{same}/{len(tokens8)} {dp:.6g}\n")


def test_divergence_rewinds_to_the_common_prefix(models, servers, tmp_path):
    s = servers(models["tiny"], tmp_path / "s")
    kv = tmp_path / "chat.kv"
    history, _ = converse(s, TURNS[:2])
    ls.save(s.url, 0, kv, s.slot_dir, head_size=64)
    # The user edits turn 2: the slot now shares turn 1 and its answer only.
    first = len(TURNS[0]) + N_PREDICT
    edited = history[:first] + [300, 301, 302]
    s.complete(edited)
    out = ls.save(s.url, 0, kv, s.slot_dir, head_size=64)
    total = len(edited) + N_PREDICT - 1
    assert out.startswith(f"{kv}: rewound to the {first} tokens it shares with the slot, appended "
                          f"{total - first} from slot 0 of {s.url} ({total} tokens in total"), out
    with kvfile.open(str(kv)) as r:
        assert list(r.tokens)[:len(edited)] == edited and len(r) == total


def test_a_save_after_a_restore_into_another_slot_appends(models, servers, tmp_path):
    # The slot's stream and sequence are the server's placement, not the
    # model's: saved from slot 0 of one server, restored into slot 1 of a
    # server with two slots, the session is saved from there again.
    a = servers(models["tiny"], tmp_path / "a")
    kv = tmp_path / "chat.kv"
    history, _ = converse(a, TURNS[:1])
    ls.save(a.url, 0, kv, a.slot_dir)
    a.stop()
    b = servers(models["tiny"], tmp_path / "b", "-np", "2")
    ls.restore(b.url, 1, kv, b.slot_dir)
    history = history + TURNS[1]
    tokens, _, evaluated = b.complete(history, slot=1)
    assert evaluated == len(TURNS[1]) + 1  # the restored cells kept; the first answer's last token and the turn
    out = ls.save(b.url, 1, kv, b.slot_dir)
    total = len(history) + len(tokens) - 1
    assert f": appended {total - (len(TURNS[0]) + N_PREDICT - 1)} tokens from slot 1 of {b.url}" in out, out
    with kvfile.open(str(kv)) as r:
        assert list(r.tokens) == (history + tokens)[:total]


def test_an_interrupted_divergent_save_leaves_the_file_as_it_was(models, servers, tmp_path):
    # A divergent save replaces the file whole: on a disk with room for the
    # file but not for its replacement it fails, and the file is as it was
    # (rewinding in place, then appending, would have changed it).
    s = servers(models["tiny"], tmp_path / "s")
    history, _ = converse(s, TURNS[:2])
    first = len(TURNS[0]) + N_PREDICT
    staged = tmp_path / "staged.kv"
    ls.save(s.url, 0, staged, s.slot_dir, head_size=64)
    size = staged.stat().st_size
    mnt = tmp_path / "small"
    mnt.mkdir()
    room = (size + size // 2 + 4095) // 4096 * 4096
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room}", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs (needs root)")
    try:
        kv = mnt / "chat.kv"
        kv.write_bytes(staged.read_bytes())
        before = digest(kv)
        s.complete(history[:first] + [300, 301, 302])
        p = cli("llama-server", "save", s.url, 0, kv, "--slot-dir", s.slot_dir, "--head-size", 64)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith(f"kvfile: error: {kv}: ") and "No space left on device" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1
        assert digest(kv) == before
        assert sorted(x.name for x in mnt.iterdir()) == ["chat.kv"]
        assert leftovers(s.slot_dir) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_faults_leave_the_file_as_it_was(models, servers, tmp_path):
    s = servers(models["tiny"], tmp_path / "s")
    kv = tmp_path / "chat.kv"
    # An empty slot: nothing to save, no file made.
    p = cli("llama-server", "save", s.url, 0, kv, "--slot-dir", s.slot_dir, "--head-size", 64)
    assert (p.returncode, p.stderr) == (2, f"kvfile: error: {s.url}: slot 0 holds no tokens; nothing to save into "
                                           f"{kv}\n")
    assert not kv.exists() and leftovers(s.slot_dir) == []
    converse(s, TURNS[:1])
    ls.save(s.url, 0, kv, s.slot_dir, head_size=64)
    before = digest(kv)
    converse(s, TURNS[:2])

    # A stale temporary file of a kvfile that is gone is removed.
    stale = s.slot_dir / "kvfile-tmp-99999999-0-save.slot"
    stale.write_bytes(b"x" * 10)
    p = cli("llama-server", "save", s.url, 0, kv, "--slot-dir", s.slot_dir, "--head-size", 64)
    assert p.returncode == 0, p.stderr
    assert p.stderr == f"kvfile: note: {stale}: removed a temporary slot file of kvfile process 99999999, " \
                       "which is gone\n"
    assert not stale.exists()
    before = digest(kv)

    # Another model, another cache type: refused before the server is asked.
    other = servers(models["other"], tmp_path / "o")
    p = cli("llama-server", "restore", other.url, 0, kv, "--slot-dir", other.slot_dir)
    assert p.returncode == 1
    assert p.stderr.startswith(f"kvfile: error: {kv}: saved from another model than the one {other.url} serves "
                               f"(other-vocab.gguf, fingerprint "), p.stderr
    assert p.stderr.endswith("; not restored\n") and p.stderr.count("\n") == 1
    with pytest.raises(kvfile.MismatchError, match=f"^{kv}: saved from another model than the one "):
        ls.restore(other.url, 0, kv, other.slot_dir)
    q8 = servers(models["tiny"], tmp_path / "q", "-fa", "on", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    p = cli("llama-server", "restore", q8.url, 0, kv, "--slot-dir", q8.slot_dir)
    assert p.returncode == 1
    assert p.stderr == (f"kvfile: error: {kv}: saved from a f16/f16 cache, the server's is q8_0/q8_0: llama.cpp "
                        "Hadamard-rotates the rows of quantized caches only, the server would misread them; not "
                        "restored\n")
    assert leftovers(q8.slot_dir) == [] and leftovers(other.slot_dir) == []

    # The server killed during a save: one line, the file as it was.
    converse(s, TURNS[:3])
    s.proc.send_signal(signal.SIGSTOP)
    child = subprocess.Popen([KVFILE, "--quiet", "llama-server", "save", s.url, "0", str(kv), "--slot-dir",
                              str(s.slot_dir), "--head-size", "64"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not established(s.port):  # kvfile has connected to the frozen server
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.01)
    s.proc.kill()
    s.proc.wait()
    err = child.communicate(timeout=60)[1]
    assert child.returncode == 2
    # The save request is the first one kvfile sends (its connection is the
    # one waited for above).
    assert err.startswith(f"kvfile: error: {s.url}/slots/0?action=save: llama-server did not answer: "), err
    assert err.count("\n") == 1
    assert digest(kv) == before and leftovers(s.slot_dir) == []


def established(port):
    """True once a TCP connection to 127.0.0.1:port is established."""
    want = f":{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[2].endswith(want) and f[3] == "01":
            return True
    return False


def test_a_slot_file_cut_by_a_full_disk_is_refused(models, servers, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs (needs root)")
    try:
        s = servers(models["tiny"], mnt / "slots")
        kv = tmp_path / "chat.kv"
        converse(s, TURNS[:1])
        ls.save(s.url, 0, kv, s.slot_dir, head_size=64)  # 17 tokens of 1 KiB: fits
        before = digest(kv)
        converse(s, TURNS[:3])  # 41 tokens: do not
        p = cli("llama-server", "save", s.url, 0, kv, "--slot-dir", s.slot_dir, "--head-size", 64)
        # The server fails its write, answers 500 and leaves a short file,
        # which kvfile removes.
        assert p.returncode == 2
        assert p.stderr == f"kvfile: error: {s.url}/slots/0?action=save: llama-server: Unable to save slot (HTTP 500)\n"
        assert digest(kv) == before and leftovers(s.slot_dir) == []
        s.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
