# SPDX-License-Identifier: Apache-2.0
"""kvfile.transformers: Hugging Face transformers' KV cache to and from .kv files.

    save_cache(cache, path, tokens, model="", fingerprint=0, dtype="bf16")
    load_cache(path, device="cuda", dtype=torch.bfloat16) -> (DynamicCache, tokens)

A cache of batch size 1 is stored as two streams, "k" and "v", of every
layer: rows_per_token = key/value heads, row_width = head dimension (the
layers' keys and values are [batch, heads, tokens, head_dim]). dtype "bf16"
(or "f16"/"f32") keeps the values exactly; "e4m3"/"e5m2" quantizes them.
Generation resumes by passing the loaded cache as past_key_values with the
token ids that follow. Imports torch and transformers when called.
"""

from . import torch as kvtorch


def _layer_tensors(cache):
    """[(keys, values)] per layer: transformers 5.x cache.layers, else 4.x key_cache/value_cache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))


def save_cache(cache, path, tokens, model="", fingerprint=0, dtype="bf16", overwrite=False):
    """Writes a DynamicCache (batch 1) and its token ids to a new .kv file."""
    import torch  # noqa: PLC0415

    pairs = _layer_tensors(cache)
    if not pairs:
        raise ValueError("the cache holds no layers")
    if pairs[0][0].shape[0] != 1:
        raise ValueError(f"only a batch of 1 is stored, the cache holds {pairs[0][0].shape[0]}")
    # [layers, heads, tokens, dim] -> [layers, tokens, heads, dim]
    keys = torch.stack([k[0] for k, _ in pairs]).transpose(1, 2)
    values = torch.stack([v[0] for _, v in pairs]).transpose(1, 2)
    kvtorch.save(path, {"k": keys, "v": values}, tokens, model=model, fingerprint=fingerprint, dtype=dtype,
                 overwrite=overwrite)


def load_cache(path, device="cuda", dtype=None, config=None):
    """Reads a .kv file written by save_cache into a new DynamicCache on `device`.
    Returns (cache, tokens): tokens an int64 tensor [tokens] on that device.
    config: the model's config, passed to DynamicCache when given."""
    import torch  # noqa: PLC0415
    from transformers import DynamicCache  # noqa: PLC0415

    loaded = kvtorch.load(path, device=device, dtype=torch.bfloat16 if dtype is None else dtype)
    keys = loaded["k"].transpose(1, 2).unsqueeze(1)  # [layers, 1, heads, tokens, dim]
    values = loaded["v"].transpose(1, 2).unsqueeze(1)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    for i in range(keys.shape[0]):
        cache.update(keys[i].contiguous(), values[i].contiguous(), i)
    return cache, loaded["tokens"]
