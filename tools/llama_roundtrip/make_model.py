#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a tiny random-weight GGUF model for the llama.cpp round trip
(docs/llama.md): 128-wide embeddings, 2 query heads and 2 KV heads of 64
values, a 128-token vocabulary with no tokenizer ("no_vocab": llama_decode
takes raw token ids). ARCH llama (default): 2 layers. ARCH gemma2: 4 layers
whose even layers attend through a sliding window of WINDOW tokens (llama.cpp
keeps them in a second, iSWA cache). Seeded, so the same file comes out
every time with the same numpy.

With --vocab the model has a SentencePiece-style ("llama") vocabulary of
326 tokens instead: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
and 67 words, with their token types and scores; llama-server needs one (it
detokenizes what it generates). --seed picks other weights, --ctx the
training context length (default 256).

usage: make_model.py GGUF_PY_DIR OUT.gguf [llama | gemma2 WINDOW] [--vocab] [--seed N] [--ctx N]
"""
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import gguf  # noqa: E402

OPTS = sys.argv[3:]
VOCAB = "--vocab" in OPTS


def option(name, default):
    return int(OPTS[OPTS.index(name) + 1]) if name in OPTS else default


# The positional words: those that are neither an option nor its value.
WORDS_GIVEN = [a for i, a in enumerate(OPTS)
               if not a.startswith("--") and not (i > 0 and OPTS[i - 1] in ("--seed", "--ctx"))]
ARCH = WORDS_GIVEN[0] if WORDS_GIVEN else "llama"
WORDS = ("the a an and of to in is it that was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said each she which do their "
         "time if will way about many then them write would like so these her long make thing see").split()
N_EMBD, N_HEAD, N_HEAD_KV, HEAD, N_LAYER, N_FF = 128, 2, 2, 64, 2, 128
if ARCH == "gemma2":
    N_LAYER = 4
N_VOCAB = 3 + 256 + len(WORDS) if VOCAB else 128

rng = np.random.default_rng(option("--seed", 19))


def weight(*shape):
    # numpy shape (rows, cols) is ggml's [cols, rows]; f16 keeps the file small.
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float16)


def norm(n):
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


w = gguf.GGUFWriter(sys.argv[2], ARCH)
w.add_name("kvfile-tiny-random")
w.add_context_length(option("--ctx", 256))
w.add_embedding_length(N_EMBD)
w.add_block_count(N_LAYER)
w.add_feed_forward_length(N_FF)
w.add_head_count(N_HEAD)
w.add_head_count_kv(N_HEAD_KV)
w.add_rope_dimension_count(HEAD)
w.add_layer_norm_rms_eps(1e-5)
w.add_vocab_size(N_VOCAB)
if VOCAB:
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581" + x for x in WORDS]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL] + [T.BYTE] * 256 + [T.NORMAL] * len(WORDS)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(WORDS))])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
else:
    w.add_tokenizer_model("no_vocab")
if ARCH == "gemma2":
    w.add_sliding_window(int(WORDS_GIVEN[1]))
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
