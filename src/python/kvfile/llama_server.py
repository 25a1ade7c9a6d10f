# SPDX-License-Identifier: Apache-2.0
"""llama-server slots kept in .kv files, from Python (docs/llama.md,
"llama-server sessions"):

    kvfile.llama_server.save(url, slot, path, slot_dir, dtype=None, head_size=128)
    kvfile.llama_server.restore(url, slot, path, slot_dir)

Both run the command `kvfile llama-server save|restore`, which owns the
whole transaction (the server calls through libcurl, the import, the one
durable append per turn, the checks before a restore): the command is found
as $KVFILE_CLI, else `kvfile` on PATH. They return the command's report
line. A refusal or failure leaves the file as it was and raises, with the
command's one error line (without its "kvfile: error: " prefix),
kvfile.MismatchError when the command exits 1 (the data does not fit:
another model, another cache, a damaged or truncated file), else
kvfile.Error (the server, the environment, the arguments: exit 2 or a
signal).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from ._kvfile import Error, MismatchError


def _command() -> str:
    cli = os.environ.get("KVFILE_CLI") or shutil.which("kvfile")
    if not cli:
        raise Error("kvfile llama-server: the kvfile command is not found (set KVFILE_CLI or put it on PATH)")
    return cli


def _run(verb: str, url: str, slot: int, path: str | os.PathLike[str], slot_dir: str | os.PathLike[str],
         extra: list[str], timeout: float) -> str:
    args = [_command(), "--quiet", "llama-server", verb, str(url), str(int(slot)), os.fspath(path),
            "--slot-dir", os.fspath(slot_dir), "--timeout", str(int(timeout))] + extra
    p = subprocess.run(args, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        line = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit status {p.returncode}"
        line = line.removeprefix("kvfile: error: ")
        raise (MismatchError if p.returncode == 1 else Error)(line)
    return p.stdout.strip()


def save(url: str, slot: int, path: str | os.PathLike[str], slot_dir: str | os.PathLike[str], dtype: str | None = None,
         head_size: int | None = None, timeout: float = 600) -> str:
    """Saves slot `slot` of the llama-server at `url` into the .kv file
    `path` (created, or appended with the tokens past what it shares with
    the slot). `slot_dir` is the server's --slot-save-path as seen here.
    dtype None keeps the cache's values; "e4m3" or "e5m2" stores fp8.
    head_size None: read from the model file the server loaded."""
    extra = [] if head_size is None else ["--head-size", str(int(head_size))]
    if dtype is not None:
        extra += ["--dtype", str(dtype)]
    return _run("save", url, slot, path, slot_dir, extra, timeout)


def restore(url: str, slot: int, path: str | os.PathLike[str], slot_dir: str | os.PathLike[str],
            timeout: float = 600) -> str:
    """Restores the .kv file (or "PACK:MEMBER") `path` into slot `slot` of
    the llama-server at `url`, in the cache types the server uses."""
    return _run("restore", url, slot, path, slot_dir, [], timeout)
