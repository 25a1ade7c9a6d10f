#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a tiny random-weight GGUF model for the llama.cpp round trip
(docs/llama.md): 128-wide embeddings, 2 query heads and 2 KV heads of 64
values, a 128-token vocabulary with no tokenizer ("no_vocab": llama_decode
takes raw token ids). ARCH llama (default): 2 layers. ARCH gemma2: 4 layers
whose even layers attend through a sliding window of WINDOW tokens (llama.cpp
keeps them in a second, iSWA cache). Seeded, so the same file comes out
every time with the same numpy.

usage: make_model.py GGUF_PY_DIR OUT.gguf [llama | gemma2 WINDOW]
"""
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402

ARCH = sys.argv[3] if len(sys.argv) > 3 else "llama"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_LAYER, N_FF, N_VOCAB = 128, 2, 2, 64, 2, 128, 128
if ARCH == "gemma2":
    N_LAYER = 4

rng = np.random.default_rng(19)


def weight(*shape):
    # numpy shape (rows, cols) is ggml's [cols, rows]; f16 keeps the file small.
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)


def norm(n):
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


w = gguf.GGUFWriter(sys.argv[2], ARCH)
w.add_name("kvfile-tiny-random")
w.add_context_length(256)
w.add_embedding_length(N_EMBD)
w.add_block_count(N_LAYER)
w.add_feed_forward_length(N_FF)
w.add_head_count(N_HEAD)
w.add_head_count_kv(N_HEAD_KV)
w.add_rope_dimension_count(HEAD)
w.add_layer_norm_rms_eps(1e-5)
w.add_vocab_size(N_VOCAB)
w.add_tokenizer_model("no_vocab")
if ARCH == "gemma2":
    w.add_sliding_window(int(sys.argv[4]))
    w.add_attn_logit_softcapping(50.0)
    w.add_final_logit_softcapping(30.0)
w.add_tensor("token_embd.weight", weight(N_VOCAB, N_EMBD))
w.add_tensor("output_norm.weight", norm(N_EMBD))
if ARCH != "gemma2":  # gemma2 ties the output to the embeddings
    w.add_tensor("output.weight", weight(N_VOCAB, N_EMBD))
for i in range(N_LAYER):
    w.add_tensor(f"blk.{i}.attn_norm.weight", norm(N_EMBD))
    w.add_tensor(f"blk.{i}.attn_q.weight", weight(N_HEAD * HEAD, N_EMBD))
    w.add_tensor(f"blk.{i}.attn_k.weight", weight(N_HEAD_KV * HEAD, N_EMBD))
    w.add_tensor(f"blk.{i}.attn_v.weight", weight(N_HEAD_KV * HEAD, N_EMBD))
    w.add_tensor(f"blk.{i}.attn_output.weight", weight(N_EMBD, N_HEAD * HEAD))
    w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(N_EMBD))
    w.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
    w.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
    w.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    if ARCH == "gemma2":
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", norm(N_EMBD))
        w.add_tensor(f"blk.{i}.post_ffw_norm.weight", norm(N_EMBD))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
