# SPDX-License-Identifier: Apache-2.0
# Writes a small session, reads it back, and checks it (shown in docs/api.md).
import os
import tempfile

import numpy as np

import kvfile

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "session.kv")
    rng = np.random.default_rng(0)

    # The "tiny" preset: 2 layers; streams k and v of 2 rows x 16 per token, stored as e4m3.
    with kvfile.create(path, "tiny", model="example/tiny", chunk_tokens=4) as w:
        for turn in range(3):
            tokens = [100 * turn + i for i in range(3)]
            # Per stream: [layers, tokens, rows_per_token, row_width], float32/float16/bf16 bits.
            rows = {s: rng.standard_normal((2, 3, 2, 16), dtype=np.float32) for s in ("k", "v")}
            w.append(tokens, rows)

    with kvfile.open(path) as r:
        info = r.info()
        print(f"{info['tokens']} tokens in {info['chunks']} chunks, format {info['version']}")
        print("tokens:", r.tokens.tolist())
        k = r.read("k", layer=1, start=2, stop=7)  # float32 [5, 2, 16]
        c = r.codes("k", layer=1, start=2, stop=7)  # kvfile.Codes: uint8 codes [5, 2, 16], float32 scales [5, 2]
        print("k:", k.shape, k.dtype, "codes:", c.codes.shape, "scales:", c.scales.shape)
        v = r.read("v", dtype="bf16")  # every layer, uint16 bf16 bits [2, 9, 2, 16]
        print("v:", v.shape, v.dtype)
        print("shared prefix:", r.longest_common_prefix([0, 1, 2, 100, 999]))

    # Append to the file later, after dropping the last turn.
    with kvfile.open(path, "a") as w:
        w.rewind(6)
        w.append([7], {s: np.zeros((2, 1, 2, 16), np.float16) for s in ("k", "v")})

    report = kvfile.verify(path)
    print("verify:", "ok" if report["ok"] else report["findings"], report["tokens"], "tokens")

    try:
        kvfile.open(os.path.join(tmp, "missing.kv"))
    except kvfile.NotFoundError as e:  # also a FileNotFoundError
        print("error:", e.code)
