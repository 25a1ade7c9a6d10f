# SPDX-License-Identifier: Apache-2.0
"""kvfile.transformers: Hugging Face transformers' KV cache to and from .kv files.

    save_cache(cache, path, tokens, model=None, dtype="bf16")
    append_cache(cache, path, tokens, model=None, dtype="bf16") -> dict
    load_cache(path, device="cuda", dtype=torch.bfloat16, model=None) -> (DynamicCache, tokens)
    model_identity(model_or_config, weights=False) -> (model_id, fingerprint)

A cache of batch size 1 is stored as two streams, "k" and "v", of every
layer: rows_per_token = key/value heads, row_width = head dimension (the
layers' keys and values are [batch, heads, tokens, head_dim]). dtype "bf16"
(or "f16"/"f32") keeps the values exactly; "e4m3"/"e5m2"/"nvfp4" quantizes
them (on the GPU for a CUDA cache). Generation resumes by passing the loaded
cache as past_key_values with the token ids that follow.

model: a transformers model or its config (anything with the config's
attributes; a dict too). The file's model id and fingerprint are then
derived from it (model_identity; spec/FORMAT.md section 14), and load_cache
and append_cache refuse a file of another model with kvfile.MismatchError
naming the fields that differ. Imports torch and transformers when called.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import torch as kvtorch

if TYPE_CHECKING:  # imported by the functions that need them, when called
    import numpy as np
    import numpy.typing as npt
    import torch
    from transformers import Cache, DynamicCache, PretrainedConfig

# The fields of the model id, in order (spec/FORMAT.md section 14).
FINGERPRINT_FIELDS: tuple[str, ...] = ("arch", "layers", "heads", "kv_heads", "head_dim", "hidden", "rope", "theta",
                                       "scaling", "window", "dtype", "weights", "rev", "name")
_PREFIX: str = "hf:"
_MODEL_ID_BYTES: int = 255


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _number(value: int | float) -> str:
    """repr of a number, without a trailing ".0"."""
    text = repr(value)
    return text[:-2] if isinstance(value, float) and text.endswith(".0") else text


def _key(name: str) -> str:
    """A RoPE parameter's name in the model id: the initials of its words when it has several."""
    words = name.split("_")
    return "".join(w[0] for w in words if w) if len(words) > 1 else name


def _text(value: object) -> str:
    """A field's value as model-id text: no spaces, '-' for none; a dict as
    key:value pairs sorted by name, joined by ','."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        value = ",".join(f"{_key(k)}:{_text(value[k])}" for k in sorted(value))
    elif isinstance(value, (list, tuple)):
        value = "/".join(_text(v) for v in value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = _number(value)
    return str(value).replace(" ", "_").replace("torch.", "")


def _fields(config: Any) -> dict[str, str]:
    """The fingerprint's fields of a config, {field: text}."""
    rope = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    rope = dict(rope) if isinstance(rope, dict) else {}
    heads = _get(config, "num_attention_heads")
    hidden = _get(config, "hidden_size")
    head_dim = _get(config, "head_dim")
    if head_dim is None and heads and hidden:
        head_dim = hidden // heads
    theta = rope.pop("rope_theta", None)
    if theta is None:
        theta = _get(config, "rope_theta")
    rope_type = rope.pop("rope_type", None) or rope.pop("type", None) or ("default" if theta is not None else None)
    architectures = _get(config, "architectures") or [_get(config, "model_type")]
    fields = {
        "arch": architectures[0],
        "layers": _get(config, "num_hidden_layers"),
        "heads": heads,
        "kv_heads": _get(config, "num_key_value_heads", heads),
        "head_dim": head_dim,
        "hidden": hidden,
        "rope": rope_type,
        "theta": float(theta) if theta is not None else None,
        "scaling": rope or None,
        "window": _get(config, "sliding_window"),
        "dtype": _get(config, "dtype") or _get(config, "torch_dtype"),
        "rev": _get(config, "_commit_hash") or _get(config, "revision"),
        "name": _get(config, "_name_or_path") or _get(config, "name_or_path") or None,
    }
    return {k: _text(v) for k, v in fields.items()}


def _weights_digest(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and bytes, in order; 16 hex digits."""
    import torch  # noqa: PLC0415

    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        t = p.detach().contiguous()
        h.update(f"{name} {tuple(t.shape)} {t.dtype};".encode())
        h.update(t.view(torch.uint8).reshape(-1).cpu().numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


# `model` (model_identity, save_cache, append_cache, load_cache): a
# transformers model (PreTrainedModel), its config (PretrainedConfig), a dict
# of the config's fields or any object with the config's attributes, read by
# name (and for save_cache, append_cache and load_cache a model id string, or
# None): typed Any.
def model_identity(model: Any, weights: bool = False) -> tuple[str, int]:
    """(model_id, fingerprint) of a transformers model or config (spec/FORMAT.md
    section 14): model_id = "hf:" then "field=value" for FINGERPRINT_FIELDS,
    one space apart, the revision cut to 12 characters and the whole to 255
    bytes (the name, last, is cut first); fingerprint = the first 8 bytes
    (little-endian) of the sha256 of the whole, uncut text. weights=True adds
    a digest of the weights (reads every parameter once)."""
    config = model if isinstance(model, dict) or not hasattr(model, "config") else model.config
    fields = _fields(config)
    fields["weights"] = _weights_digest(model) if weights else "-"
    whole = _PREFIX + " ".join(f"{k}={fields[k]}" for k in FINGERPRINT_FIELDS)
    fingerprint = int.from_bytes(hashlib.sha256(whole.encode()).digest()[:8], "little")
    fields["rev"] = fields["rev"][:12]
    model_id = _PREFIX + " ".join(f"{k}={fields[k]}" for k in FINGERPRINT_FIELDS)
    return model_id.encode()[:_MODEL_ID_BYTES].decode(errors="ignore"), fingerprint


def _parse(model_id: str) -> dict[str, str] | None:
    if not model_id.startswith(_PREFIX):
        return None
    return dict(f.split("=", 1) for f in model_id[len(_PREFIX):].split(" ") if "=" in f)


def describe_difference(file_model: str, model: str) -> str:
    """The fields two model ids differ in, as text: "theta: 500000 in the
    file, 10000 in the model; ..."."""
    a, b = _parse(file_model), _parse(model)
    if a is None:
        return f"model id {file_model!r} in the file (not a transformers model id), {model!r} for the model"
    if b is None:
        return f"model id {file_model!r} in the file, {model!r} given"
    diffs = [f"{k}: {a.get(k, '(none)')} in the file, {b.get(k, '(none)')} in the model"
             for k in FINGERPRINT_FIELDS if a.get(k) != b.get(k)]
    return "; ".join(diffs) if diffs else "the fingerprint differs (a field beyond the model id's 255 bytes)"


def _identity_args(model: Any, weights: bool) -> tuple[str | None, int | None]:
    if model is None:
        return None, None
    if isinstance(model, str):
        return model, None
    return model_identity(model, weights)


def _layer_tensors(cache: Cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(keys, values)] per layer: transformers 5.x cache.layers, else 4.x key_cache/value_cache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _streams(cache: Cache, start: int = 0) -> dict[str, torch.Tensor]:
    """{"k", "v": [layers, tokens - start, heads, dim]} of a batch-1 cache, from token `start`."""
    import torch  # noqa: PLC0415

    pairs = _layer_tensors(cache)
    if not pairs:
        raise ValueError("the cache holds no layers")
    if pairs[0][0].shape[0] != 1:
        raise ValueError(f"only a batch of 1 is stored, the cache holds {pairs[0][0].shape[0]}")
    # [layers, heads, tokens, dim] -> [layers, tokens, heads, dim]
    keys = torch.stack([k[0, :, start:] for k, _ in pairs]).transpose(1, 2)
    values = torch.stack([v[0, :, start:] for _, v in pairs]).transpose(1, 2)
    return {"k": keys, "v": values}


def save_cache(cache: Cache, path: str | os.PathLike[str],
               tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor, model: Any = None,
               fingerprint: int = 0, dtype: str = "bf16", overwrite: bool = False, weights: bool = False) -> None:
    """Writes a DynamicCache (batch 1) and its token ids to a new .kv file.
    model: a transformers model or config (the identity is derived from it,
    model_identity), or a model id string with `fingerprint`."""
    model_id, fp = _identity_args(model, weights)
    kvtorch.save(path, _streams(cache), tokens, model=model_id or "", fingerprint=fp if fp is not None else fingerprint,
                 dtype=dtype, overwrite=overwrite)


def append_cache(cache: Cache, path: str | os.PathLike[str],
                 tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor, model: Any = None,
                 dtype: str = "bf16", weights: bool = False) -> dict[str, int]:
    """Brings the .kv file at `path` up to the session `tokens` (every token
    id so far) held in `cache`: the tokens beyond the file's common prefix
    with `tokens` are appended (after a rewind to that prefix, with a
    RuntimeWarning, where they diverge); the cost of a turn is that of its own
    tokens. A missing file is created (dtype, model as save_cache). model:
    the file must have been written for it (kvfile.MismatchError naming the
    fields that differ). Returns kvfile.torch.append_turn's dict."""
    model_id, fp = _identity_args(model, weights)
    if not os.path.exists(path):
        save_cache(cache, path, tokens, model=model, dtype=dtype, weights=weights)
        return {"kept": 0, "dropped": 0, "appended": len(tokens)}
    # Only the cache's rows beyond what the file keeps are gathered.
    return kvtorch.append_turn(path, lambda kept: _streams(cache, kept), tokens, model=model_id, fingerprint=fp,
                               describe=describe_difference)


def load_cache(path: str | os.PathLike[str], device: torch.device | str | int = "cuda",
               dtype: torch.dtype | None = None, config: PretrainedConfig | None = None, model: Any = None,
               weights: bool = False) -> tuple[DynamicCache, torch.Tensor]:
    """Reads a .kv file written by save_cache into a new DynamicCache on `device`.
    Returns (cache, tokens): tokens an int64 tensor [tokens] on that device.
    config: the model's config, passed to DynamicCache when given. model: a
    transformers model or config (or a model id string) the file must have
    been written for: kvfile.MismatchError naming the fields that differ."""
    model_id, fp = _identity_args(model, weights)
    kvtorch.check_identity(path, model_id, fp, describe_difference)
    import torch  # noqa: PLC0415
    from transformers import DynamicCache  # noqa: PLC0415

    loaded = kvtorch.load(path, device=device, dtype=torch.bfloat16 if dtype is None else dtype)
    keys = loaded["k"].transpose(1, 2).unsqueeze(1)  # [layers, 1, heads, tokens, dim]
    values = loaded["v"].transpose(1, 2).unsqueeze(1)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    for i in range(keys.shape[0]):
        cache.update(keys[i].contiguous(), values[i].contiguous(), i)
    return cache, loaded["tokens"]
