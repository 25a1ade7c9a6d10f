# SPDX-License-Identifier: Apache-2.0
"""A served session persisted turn by turn, resumed in another process
(test_torch_session.py runs it; needs CUDA and transformers).

    session_check.py save DIR    a random-weight Llama (seed 0) runs a prompt,
                                 then TURNS turns of a user message and STEPS
                                 greedy tokens; after every turn its cache is
                                 appended with append_cache to a bf16, an e4m3,
                                 an e5m2 and an nvfp4 file; then it continues
                                 greedily (the reference)
    session_check.py resume DIR  a fresh process loads each file with
                                 load_cache(model=...) and continues; then
                                 configs that differ are refused

Prints one line a file ("<dtype>: identical tokens and logits", or the greedy
agreement and the logit error) and one a refused config.
"""
import copy
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kvfile
import kvfile.transformers as kvhf

STEPS = 16
TURNS = 4
DTYPES = ("bf16", "e4m3", "e5m2", "nvfp4")


def config():
    return LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                       rope_theta=10000.0, dtype="bfloat16")


def model(c=None):
    torch.manual_seed(0)
    return LlamaForCausalLM(c or config()).to("cuda", torch.bfloat16).eval()


def greedy(m, cache, first, steps, forced=None):
    """`steps` greedy steps from token `first`: (tokens, logits)."""
    tok, logits, tokens = first, [], []
    for i in range(steps):
        out = m(tok, past_key_values=cache, use_cache=True)
        step = out.logits[:, -1].float()
        logits.append(step)
        tokens.append(int(step.argmax(-1)))
        tok = torch.tensor([[forced[i] if forced is not None else tokens[-1]]], device="cuda")
    return tokens, torch.stack(logits)


@torch.no_grad()
def main(mode, folder):
    folder = Path(folder)
    m = model()
    rng = torch.Generator().manual_seed(1)
    if mode == "save":
        history = torch.randint(0, 2048, (1, 300), generator=rng).cuda()
        cache = m(history[:, :-1], use_cache=True).past_key_values
        ids = history[0, :-1].tolist()
        for turn in range(TURNS):
            # The model answers (its last token's KV comes with the next step),
            # then the user's message is run as one prefill.
            answer, _ = greedy(m, cache, history[:, -1:], STEPS)
            ids += [int(history[0, -1])] + answer[:-1]
            user = torch.randint(0, 2048, (1, 40), generator=rng).cuda()
            m(torch.tensor([[answer[-1]]], device="cuda"), past_key_values=cache, use_cache=True)
            ids.append(answer[-1])
            m(user[:, :-1], past_key_values=cache, use_cache=True)
            ids += user[0, :-1].tolist()
            history = user
            assert cache.get_seq_length() == len(ids)
            for dtype in DTYPES:
                done = kvhf.append_cache(cache, folder / f"{dtype}.kv", ids, model=m, dtype=dtype)
                if turn and done["dropped"] != 0:
                    raise AssertionError(f"turn {turn}: {done}")
            print(f"turn {turn}: {len(ids)} tokens in the cache; appended {done['appended']}")
        tokens, logits = greedy(m, cache, history[:, -1:], STEPS)
        torch.save({"ids": ids, "last": int(history[0, -1]), "tokens": tokens, "logits": logits.cpu()},
                   folder / "reference.pt")
        return
    ref = torch.load(folder / "reference.pt")
    last = torch.tensor([[ref["last"]]], device="cuda")
    for dtype in DTYPES:
        cache, tokens = kvhf.load_cache(folder / f"{dtype}.kv", device="cuda", model=m)
        assert tokens.tolist() == ref["ids"], "token ids differ"
        if dtype == "bf16":
            got, logits = greedy(m, cache, last, STEPS)
            if got == ref["tokens"] and torch.equal(logits.cpu(), ref["logits"]):
                print(f"{dtype}: identical tokens and logits ({STEPS} steps, {len(tokens)} cached tokens, "
                      f"{TURNS} turns appended)")
            else:
                diff = (logits.cpu() - ref["logits"]).abs().max().item()
                print(f"{dtype}: DIFFERENT (tokens equal: {got == ref['tokens']}, max |logit diff| {diff})")
            continue
        got, logits = greedy(m, cache, last, STEPS, forced=ref["tokens"])
        agree = sum(a == b for a, b in zip(got, ref["tokens"]))
        err = (logits.cpu() - ref["logits"]).abs()
        print(f"{dtype}: greedy agreement {agree}/{STEPS}; |logit error| max {err.max().item():.4f}, "
              f"mean {err.mean().item():.5f} (reference logits' std {ref['logits'].std().item():.4f})")
    changes = {"rope_theta": 500000.0, "rope_scaling_factor": 2.0, "num_hidden_layers": 5,
               "num_key_value_heads": 4, "dtype": "float16"}
    for field, value in changes.items():
        c = copy.deepcopy(config())
        if field == "rope_scaling_factor":
            c.rope_parameters = dict(c.rope_parameters or {}, rope_type="linear", factor=value)
        elif field == "rope_theta" and getattr(c, "rope_parameters", None):
            c.rope_parameters = dict(c.rope_parameters, rope_theta=value)  # where transformers 5 reads it
        else:
            setattr(c, field, value)
        try:
            kvhf.load_cache(folder / "bf16.kv", device="cuda", model=c)
            print(f"refused {field}: NO (loaded)")
        except kvfile.MismatchError as e:
            print(f"refused {field}: {e}")
    kvhf.load_cache(folder / "bf16.kv", device="cuda", model=config())
    print("accepted: the same config")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
