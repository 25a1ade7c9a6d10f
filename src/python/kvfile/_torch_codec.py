# SPDX-License-Identifier: Apache-2.0
"""The kvfile codec (spec/CODEC.md) in torch tensor operations, for kvfile.torch.

One code path for every device: integer bit manipulation and IEEE float32
divisions, multiplications and additions (each one rounding, as the spec
says), no torch.float8 casts (torch 1.13 lacks them, and their rounding and
saturation are not the spec's). So a CUDA tensor is encoded on the GPU and a
CPU tensor on the CPU, and both give the library's bytes.

Every divisor is a tensor on the data's device, never a Python number: CUDA
torch divides by a CPU scalar as a multiplication by its rounded reciprocal,
which is not the spec's one division (spec/CODEC.md 11.2).

Rows holding NaN or Inf are not encoded here: the caller hands them to the
library, whose refusal names the row.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from . import _kvfile

if TYPE_CHECKING:  # torch is the caller's, passed in: never imported here
    import torch

FLT_MIN: float = 2.0 ** -126
FLT_MAX: float = float(np.finfo(np.float32).max)
# kind -> (mantissa bits, bias, largest code, largest value)
_FP8: dict[str, tuple[int, int, int, float]] = {"e4m3": (3, 7, 0x7E, 448.0), "e5m2": (2, 15, 0x7B, 57344.0)}
_E2M1: list[float] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
_NVFP4_DIVISOR: float = 2688.0  # 6 * 448 (spec/CODEC.md 14.3)
_BLOCK: int = 16


def _const(torch: ModuleType, value: float, device: torch.device) -> torch.Tensor:
    return torch.full((1,), value, dtype=torch.float32, device=device)


def _f32_bits(value: float) -> int:
    return int(np.float32(value).view(np.int32))


def encode_fp8_values(torch: ModuleType, q: torch.Tensor, kind: str) -> torch.Tensor:
    """ENC_k (spec/CODEC.md 3, by the branch-free form of 11.1) of finite
    float32 tensor q: uint8 codes of q's shape."""
    m, bias, max_code, _ = _FP8[kind]
    shift = 23 - m
    bits = q.contiguous().view(torch.int32)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    # Normal range: round the mantissa to m bits (RNE), rebias.
    n = torch.clamp(mag, min=(128 - bias) << 23)
    normal = ((n + ((1 << (shift - 1)) - 1) + ((n >> shift) & 1)) >> shift) - ((127 - bias) << m)
    # Subnormal range: the f32 addition rounds to the subnormal step.
    magic = 2.0 ** (24 - bias - m)
    sub = (mag.view(torch.float32) + magic).view(torch.int32) - _f32_bits(magic)
    code = torch.clamp(torch.minimum(normal, sub), max=max_code)
    return (code | sign).to(torch.uint8)


def _row_scale(torch: ModuleType, amax: torch.Tensor, divisor: float) -> torch.Tensor:
    """amax / divisor (one f32 division), at least FLT_MIN; 1.0 where amax is 0."""
    scale = torch.clamp(amax / _const(torch, divisor, amax.device), min=FLT_MIN)
    return scale.masked_fill_(amax == 0, 1.0)


def all_finite(torch: ModuleType, t: torch.Tensor) -> bool:
    """True when no element of t is NaN or Inf (one device sync)."""
    return bool(torch.isfinite(t).all())


def quantize_fp8(torch: ModuleType, x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x (float tensor [..., width], finite) -> (codes uint8 [..., width],
    scales float32 [...]) as spec/CODEC.md 6 (QuantizeRows)."""
    x = x.to(torch.float32)
    scales = _row_scale(torch, x.abs().amax(-1), _FP8[kind][3])
    return encode_fp8_values(torch, x / scales.unsqueeze(-1), kind), scales


def quantize_nvfp4(torch: ModuleType, x: torch.Tensor,
                   table: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows x (float tensor [..., n], n a multiple of 16, finite) -> (codes
    uint8 [..., n/2], block_scales uint8 [..., n/16], scales float32 [...])
    as spec/CODEC.md 14.3. table: the e4m3 decode table on x's device."""
    x = x.to(torch.float32)
    device = x.device
    if table is None:
        table = decode_table(torch, "e4m3", device)
    n = x.shape[-1]
    blocks = x.reshape(x.shape[:-1] + (n // _BLOCK, _BLOCK))
    scales = _row_scale(torch, x.abs().amax(-1), _NVFP4_DIVISOR)
    q = blocks.abs().amax(-1) / scales.unsqueeze(-1)
    block_scales = encode_fp8_values(torch, q / _const(torch, 6.0, device), "e4m3")
    divisor = table[block_scales.long()] * scales.unsqueeze(-1)
    a = (blocks / divisor.unsqueeze(-1)).abs()
    mag = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
           + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8) + (a >= 3.5).to(torch.uint8)
           + (a > 5.0).to(torch.uint8))
    mag.masked_fill_((divisor == 0).unsqueeze(-1), 0)
    sign = ((blocks.contiguous().view(torch.int32) >> 28) & 0x8).to(torch.uint8)
    codes = (mag | sign).reshape(x.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), block_scales, scales


_tables: dict[tuple[str, str], torch.Tensor] = {}  # (kind, device) -> decode table, made once


def decode_table(torch: ModuleType, kind: str, device: torch.device | str) -> torch.Tensor:
    """The float32 decode table of an fp8 kind (256 entries) on device (kept)."""
    key = (kind, str(device))
    if key not in _tables:
        _tables[key] = torch.from_numpy(_kvfile.fp8_decode_table(kind)).to(device)
    return _tables[key]


def finite_max(torch: ModuleType, dtype: torch.dtype) -> float:
    """The largest finite value of an output dtype (exact in float32)."""
    if dtype == torch.bfloat16:
        return float(np.frombuffer(np.uint32(0x7F7F0000).tobytes(), np.float32)[0])
    if dtype == torch.float16:
        return 65504.0
    return FLT_MAX


def dequantize_nvfp4(torch: ModuleType, codes: torch.Tensor, block_scales: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype, table: torch.Tensor | None = None) -> torch.Tensor:
    """nvfp4 rows (codes uint8 [..., n/2], block_scales uint8 [..., n/16],
    scales float32 [...]) -> dtype [..., n] on the codes' device, bit-exactly
    as spec/CODEC.md 14.4: D = DEC_e4m3(B) * S, then DEC4(code) * D, a zero
    code giving the zero of its sign, clamped to dtype's finite range."""
    device = codes.device
    if table is None:
        table = decode_table(torch, "e4m3", device)
    e2m1 = torch.tensor(_E2M1, dtype=torch.float32, device=device)
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(codes.shape[:-1] + (-1, _BLOCK))
    divisor = table[block_scales.long()] * scales.unsqueeze(-1)
    mag = e2m1[(nibbles & 0x7).long()]
    values = mag * divisor.unsqueeze(-1)
    values.masked_fill_(mag == 0, 0.0)
    values = torch.where(nibbles >= 8, -values, values)
    limit = finite_max(torch, dtype)
    values.clamp_(-limit, limit)
    return values.reshape(codes.shape[:-1] + (-1,)).to(dtype)
