# SPDX-License-Identifier: Apache-2.0
"""Generation resumed from a .kv file, in two processes (test_torch.py runs it).

    resume_check.py save DIR    a random-weight Llama (seed 0) runs a prompt but
                                its last token, saves its cache as bf16, e4m3 and
                                e5m2 files, then continues greedily (the reference)
    resume_check.py resume DIR  a fresh process loads each file and continues

For every file it prints one line: "<dtype>: identical tokens and logits" or
the greedy agreement with the reference and the logit error.
"""
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import kvfile.transformers as kvhf

STEPS = 16
DTYPES = ("bf16", "e4m3", "e5m2")


def model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
    return LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def continue_greedy(m, cache, first, forced=None):
    """STEPS greedy steps from token `first`; `forced` (the reference's
    tokens) is fed instead of this run's own choice when given."""
    tok, logits, tokens = first, [], []
    for i in range(STEPS):
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
    if mode == "save":
        prompt = torch.randint(0, 2048, (1, 500), generator=torch.Generator().manual_seed(1)).cuda()
        cache = m(prompt[:, :-1], use_cache=True).past_key_values
        for dtype in DTYPES:
            kvhf.save_cache(cache, folder / f"{dtype}.kv", prompt[0, :-1], model="tiny-llama", dtype=dtype)
        tokens, logits = continue_greedy(m, cache, prompt[:, -1:])
        torch.save({"prompt": prompt.cpu(), "tokens": tokens, "logits": logits.cpu()}, folder / "reference.pt")
        return
    ref = torch.load(folder / "reference.pt")
    prompt = ref["prompt"].cuda()
    for dtype in DTYPES:
        cache, tokens = kvhf.load_cache(folder / f"{dtype}.kv", device="cuda")
        assert torch.equal(tokens, prompt[0, :-1]), "token ids differ"
        assert cache.get_seq_length() == prompt.shape[1] - 1
        if dtype == "bf16":
            got, logits = continue_greedy(m, cache, prompt[:, -1:])
            if got == ref["tokens"] and torch.equal(logits.cpu(), ref["logits"]):
                print(f"{dtype}: identical tokens and logits ({STEPS} steps, {prompt.shape[1] - 1} cached tokens)")
            else:
                diff = (logits.cpu() - ref["logits"]).abs().max().item()
                print(f"{dtype}: DIFFERENT (tokens equal: {got == ref['tokens']}, max |logit diff| {diff})")
            continue
        # Teacher-forced on the reference's tokens so that every step compares.
        got, logits = continue_greedy(m, cache, prompt[:, -1:], forced=ref["tokens"])
        agree = sum(a == b for a, b in zip(got, ref["tokens"]))
        err = (logits.cpu() - ref["logits"]).abs()
        spread = ref["logits"].std().item()
        print(f"{dtype}: greedy agreement {agree}/{STEPS}; |logit error| max {err.max().item():.4f}, "
              f"mean {err.mean().item():.5f} (reference logits' std {spread:.4f})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
