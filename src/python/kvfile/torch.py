# SPDX-License-Identifier: Apache-2.0
"""kvfile.torch: .kv files to and from torch tensors.

    load(path, device="cuda", dtype=torch.bfloat16, start=0, stop=None)
        -> {"tokens": int64 tensor [tokens], stream: tensor [layers, tokens, rows, width]}
    save(path, tensors, tokens, model="", fingerprint=0, dtype="e4m3", encoder="auto")
    append(path, tensors, tokens, encoder="auto")
    append_turn(path, tensors, tokens, model=None, fingerprint=None) -> dict
    load_into(path or reader, destination, block_ids=None, slot_mapping=None, layout="vllm", heads=None, ...)

torch is imported when one of these is called: `import kvfile` never needs it.

On a CUDA device, load reads fp8 streams as codes and scales (half the bytes
of bf16) into pinned staging buffers, a few layers at a time, copies each
part to the GPU asynchronously while the next part is read, and decodes on
the GPU exactly as the library decodes on the CPU (spec/CODEC.md): the code's
float32 value from a 256-entry table, times the row's float32 scale in
float32, clamped to the output dtype's finite range, rounded to nearest even
by the conversion. nvfp4 streams are read as codes, block scales and row
scales and decoded on the GPU as spec/CODEC.md 14.4 (kvfile._torch_codec).
Raw streams are decoded on the CPU into the staging buffers. Other devices:
decoded on the CPU, then moved.

save/append with CUDA tensors encode e4m3, e5m2 and nvfp4 streams on the GPU
(kvfile._torch_codec: the library's codes and scales byte for byte), copy
the codes and scales through pinned staging and hand them to the library's
writer as already-encoded rows; raw streams are copied as they are. A
quantized stream holding a NaN or Inf is handed to the library as rows, so
that the refusal is the library's, naming the row. CPU tensors go to the
library as rows (it quantizes them on every core).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from . import _kvfile
from . import _torch_codec as codec

if TYPE_CHECKING:  # torch is imported by the functions, when called (_torch())
    import numpy.typing as npt
    import torch

# The stored dtypes (the library's table, spec/FORMAT.md 2.1): by name, and
# those stored as codes and scales.
_DTYPES: dict[str, dict[str, Any]] = {d["name"]: d for d in _kvfile.dtype_table()}
_QUANTIZED: frozenset[str] = frozenset(name for name, d in _DTYPES.items() if d["quantization"] != "none")

# Bytes of pinned staging per part; two parts are in flight (double
# buffering). A layer larger than this makes a part of its own. Measured on
# an H200 host (docs/gpu.md): for a 32k-token llama-3.1-8b session (69 MB a
# layer) three layers a part load faster than one or two, and the two
# buffers stay under 512 MiB.
STAGING_BYTES: int = 256 << 20
_ALIGN: int = 256
# load_into reads layer 0 first and alone, in this many token slices (whole
# chunks), each copied and decoded on the GPU while the next is read. With
# the reader keeping its threads and the next part read ahead, two slices
# put layer 0 in place soonest on an H200 host (tools/bench/gpu_layer0.sh,
# docs/gpu.md): one slice waits for the whole layer's read before its copy,
# four or more add a read call and a queued part each.
FIRST_LAYER_SLICES: int = 2
# A CUDA load reads each part after the first in a thread while the part
# before it is queued (copy, decode, scatter), instead of after; False reads
# them in turn on the loading thread.
READ_AHEAD: bool = True

_staging_lock = threading.Lock()
# device index -> [_Pinned] * 3 (two for loads, one for saves), reused
_staging: dict[int | None, list[_Pinned | None]] = {}
# device index -> lock: one CUDA load at a time uses a device's staging
_device_locks: dict[int | None, threading.Lock] = {}


def _torch() -> ModuleType:
    import torch  # noqa: PLC0415  (lazy on purpose: the package never requires torch)
    return torch


def _np_dtype_name(torch: ModuleType, dtype: torch.dtype) -> str:
    """The name read_all takes for a torch output dtype."""
    names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    if dtype not in names:
        raise TypeError(f"dtype must be torch.bfloat16, torch.float16 or torch.float32, not {dtype}")
    return names[dtype]


def _numpy_view(torch: ModuleType, t: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy array sharing the memory of CPU tensor t (bf16 as int16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()


def dequantize(codes: torch.Tensor, scales: torch.Tensor, kind: str, dtype: torch.dtype,
               table: torch.Tensor | None = None) -> torch.Tensor:
    """Decodes fp8 codes (uint8 tensor [..., rows, width]) with their scales
    (float32 [..., rows]) into `dtype` on the codes' device, bit-exactly as
    the library's CPU decode: float32 table[code] * scale, clamped to the
    finite range of dtype, rounded to nearest even. `table` may be the
    kind's decode table on that device (made when None)."""
    torch = _torch()
    if table is None:
        table = torch.from_numpy(_kvfile.fp8_decode_table(kind)).to(codes.device)
    values = torch.index_select(table, 0, codes.reshape(-1).to(torch.int32)).view(codes.shape)
    values.mul_(scales.unsqueeze(-1))  # float32 * float32: one IEEE rounding
    limit = codec.finite_max(torch, dtype)
    values.clamp_(-limit, limit)
    return values.to(dtype)


def load(path: str | os.PathLike[str], device: torch.device | str | int = "cuda", dtype: torch.dtype | None = None,
         start: int = 0, stop: int | None = None, threads: int = 0, staging_bytes: int | None = None,
         stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """Reads tokens [start, stop) of every stream of a .kv file into tensors on
    `device`: {"tokens": int64 [tokens], name: [layers, tokens, rows, width]}
    in `dtype` (default torch.bfloat16). A stream in some layers only (a layer
    set, spec/FORMAT.md 3.2) has those layers, in order, and the result says
    which under "<name>.layers" (a list of layer numbers). threads: reader threads (0: one per
    core). staging_bytes: pinned bytes per part on CUDA (default
    STAGING_BYTES). stats: a dict that, on CUDA, receives "parts",
    "h2d_bytes" and "h2d_seconds" (the copies' time by CUDA events). On CUDA
    the result is ready when load returns."""
    torch = _torch()
    dtype = torch.bfloat16 if dtype is None else dtype
    dtype_name = _np_dtype_name(torch, dtype)
    device = torch.device(device)
    with _kvfile.open_reader(str(path)) as reader:
        _warn_if_rotated(reader, path)
        ids = reader.tokens
        stop = len(ids) if stop is None else stop
        if stop < start:
            raise ValueError(f"stop ({stop}) is before start ({start})")
        tokens = torch.from_numpy(ids[start:stop].astype(np.int64))
        # Layer sets go through the CPU read (one call for every stream).
        layer_sets = {s["name"]: s["layers"] for s in reader.geometry["streams"] if "layers" in s}
        if device.type == "cuda" and not layer_sets:
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            with _staging_lock:
                lock = _device_locks.setdefault(device.index, threading.Lock())
            with lock:
                out = _load_cuda(torch, reader, device, dtype, dtype_name, start, stop, threads,
                                 STAGING_BYTES if staging_bytes is None else staging_bytes, stats)
        else:
            out = _load_cpu(torch, reader, dtype, dtype_name, start, stop, threads)
            if device.type != "cpu":
                out = {name: t.to(device) for name, t in out.items()}
    result = {"tokens": tokens.to(device)}
    result.update(out)
    result.update({name + ".layers": list(layers) for name, layers in layer_sets.items()})
    return result


def _warn_if_rotated(reader: _kvfile.Reader, path: str | os.PathLike[str]) -> None:
    """A file imported from a llama.cpp quantized cache may hold
    Hadamard-rotated K and V rows (spec/FORMAT.md section 13, docs/llama.md,
    "The Hadamard trap"); the tensors load returns are taken for plain keys
    and values, so say so (a RuntimeWarning) where the model id records
    rotated=yes, or rotated=unknown with a quantized cache type."""
    model = reader.info()["model"]
    if not model.startswith("llama.cpp:"):
        return
    fields = dict(item.split("=", 1) for item in model.split()[1:] if "=" in item)
    rotated = fields.get("rotated", "unknown")
    quantized = any(fields.get(k) not in ("f32", "f16", "bf16") for k in ("k", "v"))
    if rotated == "yes" or (rotated != "no" and quantized):
        warnings.warn(f"{path}: the k and v rows were imported from a llama.cpp {fields.get('k')}/{fields.get('v')} "
                      f"cache and {'are' if rotated == 'yes' else 'may be'} Hadamard-rotated, not plain keys and "
                      f"values (rotated={rotated}); import the llama.cpp file with --unrotate (docs/llama.md)",
                      RuntimeWarning, stacklevel=3)


def _shape(spec: Mapping[str, Any], layers: int, tokens: int) -> tuple[int, int, int, int]:
    return (layers, tokens, spec["rows_per_token"], spec["row_width"])


def _load_cpu(torch: ModuleType, reader: _kvfile.Reader, dtype: torch.dtype, dtype_name: str, start: int, stop: int,
              threads: int) -> dict[str, torch.Tensor]:
    geometry = reader.geometry
    out = {s["name"]: torch.empty(_shape(s, len(s.get("layers", ())) or geometry["layers"], stop - start),
                                  dtype=dtype)
           for s in geometry["streams"]}
    reader.read_all(dtype=dtype_name, start=start, stop=stop, threads=threads,
                    out={name: _numpy_view(torch, t) for name, t in out.items()})
    return out


class _Layout:
    """Where each stream's part of `layers` layers lies in a staging buffer."""

    entries: list[tuple[str, str | None, tuple[int, int, int, int], int, int | None, int | None]]
    bytes: int

    def __init__(self, streams: Sequence[Mapping[str, Any]], quantized: Mapping[str, str], layers: int, tokens: int,
                 out_size: int) -> None:
        # (name, quantized kind or None, shape, codes or rows offset, scales
        # offset or None, nvfp4 block scales offset or None)
        self.entries = []
        offset = 0
        for s in streams:
            shape = _shape(s, layers, tokens)
            elements = int(np.prod(shape))
            kind = quantized.get(s["name"])
            if kind is None:
                self.entries.append((s["name"], None, shape, offset, None, None))
                offset = _round_up(offset + elements * out_size)
                continue
            at: dict[str, int] = {}
            for part, (np_dtype, part_shape) in _part_shapes(kind, shape).items():
                at[part] = offset
                offset = _round_up(offset + int(np.prod(part_shape)) * np.dtype(np_dtype).itemsize)
            self.entries.append((s["name"], kind, shape, at["codes"], at["scales"], at.get("block_scales")))
        self.bytes = offset


def _part_shapes(kind: str, shape: tuple[int, ...]) -> dict[str, tuple[type[np.generic], tuple[int, ...]]]:
    """The arrays of a quantized stream's parts, in the dtype table's order,
    for values of `shape` [layers, tokens, rows, width]: {part: (numpy
    dtype, shape)}; a per-token dtype (nvfp4) has one row of rows * width
    per token."""
    d = _DTYPES[kind]
    rows, width = (shape[:2], shape[2] * shape[3]) if d["quantization"] == "token" else (shape[:3], shape[3])
    sizes = {"codes": (np.uint8, rows + (width * d["element_bits"] // 8,)),
             "block_scales": (np.uint8, rows + (width // max(d["block_elements"], 1),)),
             "scales": (np.float32, rows)}
    return {part: sizes[part] for part in d["parts"]}


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Pinned:
    """A page-locked host buffer of exactly nbytes: ordinary memory registered
    with CUDA (torch's pinned allocator would round it up to a power of two,
    doubling the host memory of a 3-layer part), or, where registering is not
    available, torch's pinned memory."""

    tensor: torch.Tensor
    registered: bool
    _cudart: Any

    def __init__(self, torch: ModuleType, nbytes: int) -> None:
        self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        self.registered = False
        try:
            cudart = torch.cuda.cudart()
            self.registered = int(cudart.cudaHostRegister(self.tensor.data_ptr(), nbytes, 0)) == 0
            self._cudart = cudart
        except (AttributeError, RuntimeError, TypeError):
            pass
        if not self.registered:
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def __del__(self) -> None:
        if self.registered:
            self._cudart.cudaHostUnregister(self.tensor.data_ptr())


def _pinned(torch: ModuleType, device: torch.device, slot: int, nbytes: int) -> _Pinned:
    """Pinned staging buffer `slot` (0 and 1: loads, 2: saves) of at least
    nbytes, kept for later calls."""
    with _staging_lock:
        bufs = _staging.setdefault(device.index, [None, None, None])
        if bufs[slot] is None or bufs[slot].tensor.numel() < nbytes:
            bufs[slot] = None
            bufs[slot] = _Pinned(torch, nbytes)
        return bufs[slot]


def release_staging() -> None:
    """Frees the pinned staging buffers load keeps between calls."""
    with _staging_lock:
        _staging.clear()


def _parts(layers: int, part_layers: int, start: int, stop: int, chunk_tokens: int,
           first_slices: int) -> list[tuple[int, int, int, int]]:
    """The parts of a CUDA load, in order: (first layer, last layer, first
    token, stop token). first_slices > 0: layer 0 first, alone, in about
    first_slices token slices that end on the file's chunk boundaries
    (multiples of chunk_tokens), so that each slice is copied and decoded
    while the next is read; then the other layers in parts of part_layers
    layers, every token each. first_slices 0: parts of part_layers layers
    from layer 0."""
    parts: list[tuple[int, int, int, int]] = []
    first = 0
    if first_slices > 0:
        chunk_tokens = max(1, chunk_tokens)
        step = -(-(stop - start) // first_slices)
        step = -(-step // chunk_tokens) * chunk_tokens
        cuts = [start] + list(range(start - start % chunk_tokens + step, stop, step)) + [stop]
        parts += [(0, 1, lo, hi) for lo, hi in zip(cuts, cuts[1:])]
        first = 1
    while first < layers:
        parts.append((first, min(layers, first + part_layers), start, stop))
        first = parts[-1][1]
    return parts


def _load_cuda(torch: ModuleType, reader: _kvfile.Reader, device: torch.device, dtype: torch.dtype, dtype_name: str,
               start: int, stop: int, threads: int, staging_bytes: int, stats: dict[str, Any] | None,
               sink: Callable[[str, int, int, int, int, torch.Tensor], None] | None = None,
               part_done: Callable[[int, int, torch.cuda.Stream], None] | None = None, first_slices: int = 0,
               prepare: Callable[[], None] | None = None) -> dict[str, torch.Tensor] | None:
    """load's CUDA path. sink(name, first, last, lo, hi, values) takes each
    part's decoded [last - first, hi - lo, rows, width] tensor of layers
    [first, last) and tokens [start + lo, start + hi) (on the copy stream)
    instead of the contiguous outputs (then None is returned);
    part_done(first, last, stream) is called once layers [first, last) are
    queued whole. first_slices: as for _parts (layer 0 is ready sooner).
    prepare(): setup of the caller's that runs while the first part is read
    (before any sink call)."""
    geometry = reader.geometry
    streams = geometry["streams"]
    layers, tokens = geometry["layers"], stop - start
    info = reader.info()
    v1 = info["major_version"] == 1
    quantized = {s["name"]: s["dtype"] for s in streams if not v1 and s["dtype"] in _QUANTIZED}
    out_size = torch.empty((), dtype=dtype).element_size()
    out = None
    if tokens == 0 or layers == 0:
        if prepare is not None:
            prepare()
        if sink is None:
            out = {s["name"]: torch.empty(_shape(s, layers, tokens), dtype=dtype, device=device) for s in streams}
        return out
    per_layer = _Layout(streams, quantized, 1, tokens, out_size).bytes
    part_layers = max(1, min(layers, staging_bytes // max(per_layer, 1)))
    capacity = _Layout(streams, quantized, part_layers, tokens, out_size).bytes
    parts = _parts(layers, part_layers, start, stop, info["chunk_tokens"], first_slices)
    layouts = {}  # (layers, tokens) -> _Layout: each part packed from offset 0, copied in `used` bytes
    staging = [_pinned(torch, device, i, capacity) for i in range(2)]
    pinned = [b.tensor for b in staging]
    host = [p.numpy() for p in pinned]
    code_names = [s["name"] for s in streams if s["name"] in quantized]
    raw_names = [s["name"] for s in streams if s["name"] not in quantized]
    raw = np.float32 if out_size == 4 else (np.float16 if dtype == torch.float16 else np.int16)

    def read(first: int, last: int, lo: int, hi: int, slot: int) -> tuple[dict[str, Any], int]:
        """Reads a part into host[slot]: {name: (kind, shape, parts, arrays)}, bytes used."""
        n, count = last - first, hi - lo
        key = (n, count)
        if key not in layouts:
            layouts[key] = _Layout(streams, quantized, n, count, out_size)
        layout = layouts[key]
        views = {}  # name -> (kind, shape, [(offset, numpy dtype, shape)], numpy arrays)
        for name, kind, shape, a, b, c in layout.entries:
            if kind is not None:
                offsets = {"codes": a, "scales": b, "block_scales": c}
                pieces = [(offsets[part], np_dtype, part_shape)
                          for part, (np_dtype, part_shape) in _part_shapes(kind, shape).items()]
            else:
                pieces = [(a, raw, shape)]
            arrays = []
            for at, np_dtype, part_shape in pieces:
                nbytes = int(np.prod(part_shape)) * np.dtype(np_dtype).itemsize
                arrays.append(host[slot][at:at + nbytes].view(np_dtype).reshape(part_shape))
            views[name] = (kind, shape, pieces, arrays)
        if code_names:
            reader.codes_all(start=lo, stop=hi, threads=threads, layers=(first, last), streams=code_names,
                             out={name: tuple(views[name][3]) for name in code_names})
        if raw_names:
            reader.read_all(dtype=dtype_name, start=lo, stop=hi, threads=threads, layers=(first, last),
                            streams=raw_names, out={name: views[name][3][0] for name in raw_names})
        return views, layout.bytes

    done = [None, None]  # event: the slot's pinned buffer has been copied out

    def fetch(part: int) -> tuple[dict[str, Any], int]:
        """Reads part `part` into its slot once the slot's last copy is done."""
        slot = part % 2
        if done[slot] is not None:
            with torch.cuda.device(device):  # a thread of its own: its current device may be another
                done[slot].synchronize()
        return read(*parts[part], slot)

    # The first part is read (every reader thread, the GIL released) while
    # the rest is set up: the decode tables, the stream, the GPU buffers,
    # the outputs and the caller's prepare().
    ahead = _Background(lambda: fetch(0))
    try:
        tables = {kind: codec.decode_table(torch, kind, device)
                  for kind in {"e4m3" if k == "nvfp4" else k for k in quantized.values()}}
        copy_stream = torch.cuda.Stream(device)
        gpu = [torch.empty(capacity, dtype=torch.uint8, device=device) for _ in range(2)]
        if sink is None:
            out = {s["name"]: torch.empty(_shape(s, layers, tokens), dtype=dtype, device=device) for s in streams}

            def sink(name: str, first: int, last: int, lo: int, hi: int, values: Any) -> None:
                out[name][first:last, lo:hi] = values
        if prepare is not None:
            prepare()
    except BaseException:
        ahead.wait()
        raise
    timings = []  # (start event, end event, bytes) per copy, when stats is asked for
    # The GPU buffers and outputs are used on copy_stream only from here on.
    copy_stream.wait_stream(torch.cuda.current_stream(device))
    try:
        for part, (first, last, lo, hi) in enumerate(parts):
            slot = part % 2
            views, used = ahead.result() if ahead is not None else fetch(part)
            ahead = None
            with torch.cuda.stream(copy_stream):
                g = gpu[slot]
                if stats is not None:
                    timings.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                                    used))
                    timings[-1][0].record(copy_stream)
                g[:used].copy_(pinned[slot][:used], non_blocking=True)
                if stats is not None:
                    timings[-1][1].record(copy_stream)
                done[slot] = torch.cuda.Event()
                done[slot].record(copy_stream)
                # The next part is read (in a thread) while this one's
                # decode and scatter are queued.
                if READ_AHEAD and part + 1 < len(parts):
                    ahead = _Background(lambda p=part + 1: fetch(p))
                for name, (kind, shape, pieces, _) in views.items():
                    t = []
                    for at, np_dtype, part_shape in pieces:
                        nbytes = int(np.prod(part_shape)) * np.dtype(np_dtype).itemsize
                        t.append(g[at:at + nbytes].view(_TORCH_OF[np.dtype(np_dtype).name](torch)).view(part_shape))
                    if kind is None:  # a raw stream: its values as they are
                        values = t[0].view(dtype)
                    elif _DTYPES[kind]["quantization"] == "token":
                        values = codec.dequantize_nvfp4(torch, t[0], t[1], t[2], dtype, tables["e4m3"]).view(shape)
                    else:
                        values = dequantize(t[0], t[1], kind, dtype, tables[kind])
                    sink(name, first, last, lo - start, hi - start, values)
                if part_done is not None and hi == stop:
                    part_done(first, last, copy_stream)
    finally:
        if ahead is not None:  # a failure above: no read may outlive the call (the staging is shared)
            ahead.wait()
    copy_stream.synchronize()
    if stats is not None:
        stats["parts"] = len(timings)
        stats["registered"] = all(b.registered for b in staging)
        stats["h2d_bytes"] = sum(n for _, _, n in timings)
        stats["h2d_seconds"] = sum(a.elapsed_time(b) for a, b, _ in timings) / 1e3
    return out


class _Background:
    """fn() running in a thread: result() waits and returns its value or
    raises its exception; wait() only waits."""

    _out: dict[str, Any]
    _thread: threading.Thread

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._out = {}

        def body() -> None:
            try:
                self._out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - raised by result()
                self._out["error"] = e
        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


# numpy dtype name -> torch dtype of the same bytes
_TORCH_OF: dict[str, Callable[[ModuleType], torch.dtype]] = {
    "uint8": lambda torch: torch.uint8, "float32": lambda torch: torch.float32,
    "float16": lambda torch: torch.float16, "int16": lambda torch: torch.int16}


def _host_rows(torch: ModuleType, t: torch.Tensor, layers_tokens_check: Callable[[str, int, int], None],
               name: str) -> npt.NDArray[Any]:
    """A contiguous CPU numpy array of tensor t for Writer.append (bf16 as uint16 bits)."""
    if t.dim() != 4:
        raise ValueError(f"stream '{name}': expected a tensor [layers, tokens, rows, width], got shape {tuple(t.shape)}")
    layers_tokens_check(name, t.shape[0], t.shape[1])
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    if t.dtype not in (torch.float16, torch.float32):
        t = t.to(torch.float32)
    return t.contiguous().numpy()


def _token_ids(tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor) -> npt.NDArray[Any]:
    return tokens.detach().to("cpu").numpy() if hasattr(tokens, "detach") else np.asarray(tokens)


def _encoded(torch: ModuleType, writer: _kvfile.Writer, tensors: Mapping[str, torch.Tensor], count: int,
             check: Callable[[str, int, int], None],
             ) -> dict[str, npt.NDArray[Any] | tuple[npt.NDArray[Any], ...]] | None:
    """The streams of an append encoded with kvfile._torch_codec on the
    tensors' device and copied to the host (through pinned staging from a
    GPU): {name: (codes, scales) | (codes, block_scales, scales) | rows}, or
    None when a quantized stream holds a NaN or Inf (the library's refusal,
    naming the row, is then the one raised)."""
    kinds = {s["name"]: s["dtype"] for s in writer.geometry["streams"]}
    parts: dict[str, list[Any]] = {}  # name -> [device tensors]
    for name, t in tensors.items():
        if t.dim() != 4:
            raise ValueError(f"stream '{name}': expected a tensor [layers, tokens, rows, width], "
                             f"got shape {tuple(t.shape)}")
        check(name, t.shape[0], t.shape[1])
        kind = kinds.get(name)
        t = t.detach()
        if kind in _QUANTIZED:
            if not codec.all_finite(torch, t):
                return None
            if _DTYPES[kind]["quantization"] == "token":
                parts[name] = list(codec.quantize_nvfp4(torch, t.reshape(t.shape[:2] + (-1,))))
            else:
                parts[name] = list(codec.quantize_fp8(torch, t, kind))
        else:
            # Raw streams travel as they are (bf16 as its bits).
            if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
                t = t.to(torch.float32)
            parts[name] = [t.contiguous().view(torch.int16) if t.dtype == torch.bfloat16 else t.contiguous()]
    device = next(iter(tensors.values())).device
    if device.type != "cuda":
        host = {name: [p.cpu().numpy() for p in ps] for name, ps in parts.items()}
    else:
        host = _to_pinned(torch, device, parts)
    out: dict[str, npt.NDArray[Any] | tuple[npt.NDArray[Any], ...]] = {}
    for name, arrays in host.items():
        if len(arrays) == 1:
            out[name] = arrays[0].view(np.uint16) if arrays[0].dtype == np.int16 else arrays[0]
        else:
            out[name] = tuple(arrays)  # (codes, scales) or (codes, block_scales, scales)
    return out


def _to_pinned(torch: ModuleType, device: torch.device,
               parts: Mapping[str, Sequence[torch.Tensor]]) -> dict[str, list[npt.NDArray[Any]]]:
    """Copies device tensors into one pinned staging buffer (slot 2 of the
    device's staging), waits, and returns numpy views of the copies."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    offsets: dict[str, list[int]] = {}
    total = 0
    for name, ps in parts.items():
        offsets[name] = []
        for p in ps:
            offsets[name].append(total)
            total = _round_up(total + p.numel() * p.element_size())
    pinned = _pinned(torch, device, 2, max(total, 1)).tensor
    for name, ps in parts.items():
        for p, at in zip(ps, offsets[name]):
            nbytes = p.numel() * p.element_size()
            pinned[at:at + nbytes].copy_(p.reshape(-1).view(torch.uint8), non_blocking=True)
    torch.cuda.current_stream(device).synchronize()
    host = pinned.numpy()
    names = {torch.uint8: np.uint8, torch.float32: np.float32, torch.float16: np.float16, torch.int16: np.int16}
    return {name: [host[at:at + p.numel() * p.element_size()].view(names[p.dtype]).reshape(tuple(p.shape))
                   for p, at in zip(ps, offsets[name])]
            for name, ps in parts.items()}


def _append(torch: ModuleType, writer: _kvfile.Writer, tensors: Mapping[str, torch.Tensor],
            tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor,
            encoder: Literal["auto", "torch", "library"] = "auto") -> None:
    """Appends through `writer`. encoder: "torch" (encode with torch on the
    tensors' device), "library" (rows to the library), "auto" (torch for
    CUDA tensors)."""
    if encoder not in ("auto", "torch", "library"):
        raise ValueError(f'encoder must be "auto", "torch" or "library", not {encoder!r}')
    ids = _token_ids(tokens)
    count = len(ids)

    def check(name: str, layers: int, n: int) -> None:
        if n != count:
            raise ValueError(f"stream '{name}': {n} tokens, but {count} token ids")

    on_device = all(getattr(t, "is_cuda", False) for t in tensors.values())
    if encoder == "torch" or (encoder == "auto" and on_device):
        device = next(iter(tensors.values())).device
        lock: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if device.type == "cuda":  # the device's save staging is in use until append returns
            index = device.index if device.index is not None else torch.cuda.current_device()
            with _staging_lock:
                lock = _device_locks.setdefault(index, threading.Lock())
        with lock:
            encoded = _encoded(torch, writer, tensors, count, check)
            if encoded is not None:
                writer.append(ids, encoded)
                return
    writer.append(ids, {name: _host_rows(torch, t, check, name) for name, t in tensors.items()})


def save(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor],
         tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor,
         model: str = "", fingerprint: int = 0, dtype: str | dict[str, str] = "e4m3", chunk_tokens: int = 256,
         overwrite: bool = False, encoder: Literal["auto", "torch", "library"] = "auto") -> None:
    """Writes a new .kv file from {stream: tensor [layers, tokens, rows, width]} (any
    device, float dtypes) and the token ids, durably (synced when it returns).
    dtype: the storage dtype of every stream ("e4m3", "e5m2", "nvfp4", "bf16",
    "f16", "f32"), or a dict {stream: dtype}. encoder: "auto" encodes CUDA
    tensors on the GPU (kvfile._torch_codec, the library's bytes) and hands CPU
    tensors to the library; "torch" encodes with torch on any device;
    "library" copies rows to the host and lets the library encode them."""
    torch = _torch()
    if not tensors:
        raise ValueError("tensors is empty")
    layers = {t.shape[0] for t in tensors.values()}
    if len(layers) != 1:
        raise ValueError(f"every stream needs the same layer count, got {sorted(layers)}")
    geometry = {"layers": layers.pop(), "streams": [
        {"name": name, "rows_per_token": int(t.shape[2]), "row_width": int(t.shape[3]),
         "dtype": dtype[name] if isinstance(dtype, dict) else dtype}
        for name, t in tensors.items()]}
    with _kvfile.create(str(path), geometry, model=model, fingerprint=fingerprint,
                        chunk_tokens=chunk_tokens, overwrite=overwrite) as writer:
        _append(torch, writer, tensors, tokens, encoder)


def append(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor],
           tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor,
           encoder: Literal["auto", "torch", "library"] = "auto") -> None:
    """Appends tokens and their rows ({stream: tensor [layers, tokens, rows, width]})
    to an existing .kv file, durably. encoder: as for save."""
    torch = _torch()
    with _kvfile.open_writer(str(path)) as writer:
        _append(torch, writer, tensors, tokens, encoder)


def check_identity(path: str | os.PathLike[str], model: str | None = None, fingerprint: int | None = None,
                   describe: Callable[[str, str], str] | None = None) -> None:
    """Raises kvfile.MismatchError when the file's model id or
    fingerprint is not `model` / `fingerprint` (None: not checked).
    describe(file_model, model) -> text naming what differs (default: both ids)."""
    if model is None and fingerprint is None:
        return
    with _kvfile.open_reader(str(path)) as reader:
        info = reader.info()
    same_model = model is None or info["model"] == model
    same_fp = fingerprint is None or info["fingerprint"] == fingerprint
    if same_model and same_fp:
        return
    if describe is not None:
        what = describe(info["model"], model if model is not None else info["model"])
    elif not same_model:
        what = f"model id {info['model']!r} in the file, {model!r} given"
    else:
        what = ""
    if not same_fp and not what:
        what = f"fingerprint {info['fingerprint']:016x} in the file, {fingerprint:016x} given"
    raise _kvfile.MismatchError(f"{path}: written for another model: {what}")


def append_turn(path: str | os.PathLike[str],
                tensors: Mapping[str, torch.Tensor] | Callable[[int], Mapping[str, torch.Tensor]],
                tokens: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor, model: str | None = None,
                fingerprint: int | None = None, encoder: Literal["auto", "torch", "library"] = "auto",
                describe: Callable[[str, str], str] | None = None) -> dict[str, int]:
    """Brings the .kv file at `path` up to a session of `tokens` (every token
    id so far) whose rows are `tensors` ({stream: [layers, tokens, rows,
    width]}, any device; only the rows beyond the file's are read), or a
    callable taking the count of tokens kept and returning the rows from that
    token on. Keeps the
    longest common prefix of the file's tokens and `tokens`; where they
    diverge, the file is first rewound to that prefix (durably, with a
    RuntimeWarning saying how many tokens were dropped). Then the tokens
    beyond the prefix are appended in one durable append: a turn costs its
    own tokens, not the session's. model/fingerprint: refused
    (kvfile.MismatchError, naming what differs) when the file's are not these.
    Returns {"kept": tokens kept, "dropped": tokens rewound away, "appended": n}."""
    torch = _torch()
    check_identity(path, model, fingerprint, describe)
    ids = _token_ids(tokens)
    with _kvfile.open_writer(str(path)) as writer:
        had = len(writer)
        kept = int(writer.longest_common_prefix(ids))
        if kept < had:
            warnings.warn(f"{path}: the file's tokens diverge from the session's at token {kept}; "
                          f"rewound from {had} to {kept} tokens before appending", RuntimeWarning, stacklevel=2)
            writer.rewind(kept)
        if len(ids) > kept:
            new = tensors(kept) if callable(tensors) else {name: t[:, kept:] for name, t in tensors.items()}
            _append(torch, writer, new, ids[kept:], encoder)
    return {"kept": kept, "dropped": had - kept, "appended": len(ids) - kept}


_LAYOUTS: tuple[str, ...] = ("vllm", "nhd", "hnd")


def _open(path: str | os.PathLike[str] | _kvfile.Reader) -> contextlib.AbstractContextManager[_kvfile.Reader]:
    """A context giving a reader of `path`: opened here and closed on exit,
    or, where path is a kvfile.Reader, that reader, left open."""
    if isinstance(path, _kvfile.Reader):
        return contextlib.nullcontext(path)
    return _kvfile.open_reader(str(path))


def _slot_indices(torch: ModuleType, layout: str, destination: Sequence[torch.Tensor], device: torch.device,
                  tokens: int, block_ids: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None,
                  slot_mapping: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(block index, offset in block) int64 tensors [tokens] on device."""
    first = destination[0]
    if layout == "vllm":
        block_size = first.shape[2]  # [2, num_blocks, block_size, heads, dim]
    elif layout == "nhd":
        block_size = first.shape[2]  # [num_pages, 2, page_size, heads, dim]
    else:
        block_size = first.shape[3]  # [num_pages, 2, heads, page_size, dim]
    if (block_ids is None) == (slot_mapping is None):
        raise ValueError("pass exactly one of block_ids and slot_mapping")
    if slot_mapping is not None:
        slots = torch.as_tensor(slot_mapping, dtype=torch.int64).to(device)
        if slots.numel() != tokens:
            raise ValueError(f"slot_mapping has {slots.numel()} slots for {tokens} tokens")
    else:
        blocks = torch.as_tensor(block_ids, dtype=torch.int64).to(device)
        need = (tokens + block_size - 1) // block_size
        if blocks.numel() < need:
            raise ValueError(f"block_ids has {blocks.numel()} blocks, {tokens} tokens need {need} "
                             f"of {block_size}")
        t = torch.arange(tokens, device=device)
        slots = blocks[t // block_size] * block_size + t % block_size
    return slots // block_size, slots % block_size


class LayerLoad:
    """A load_into running in a thread: wait_for_layer(i) makes the current
    CUDA stream wait until layer i is in the destination (vLLM's
    wait_for_layer_load); result() waits for the whole load and returns
    its events."""

    events: list[torch.cuda.Event | None]
    _queued: list[threading.Event]
    _error: BaseException | None
    _thread: threading.Thread

    def __init__(self, layers: int, run: Callable[[Callable[[int, torch.cuda.Event | None], None]], None]) -> None:
        self._queued = [threading.Event() for _ in range(layers)]
        self.events = [None] * layers
        self._error = None

        def body() -> None:
            try:
                run(self._ready)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                self._error = e
            finally:
                for q in self._queued:
                    q.set()
        self._thread = threading.Thread(target=body, daemon=True)
        self._thread.start()

    def _ready(self, layer: int, event: torch.cuda.Event | None) -> None:
        self.events[layer] = event
        self._queued[layer].set()

    def wait_for_layer(self, layer: int) -> None:
        self._queued[layer].wait()
        if self._error is not None:
            raise self._error
        _torch().cuda.current_stream().wait_event(self.events[layer])

    def result(self) -> list[torch.cuda.Event | None]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.events


# load_into's result: the layers' events, or with background=True a LayerLoad.
@overload
def load_into(path: str | os.PathLike[str] | _kvfile.Reader, destination: Iterable[torch.Tensor],
              block_ids: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              slot_mapping: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              layout: Literal["vllm", "nhd", "hnd"] = "vllm", heads: tuple[int, int] | None = None,
              streams: Sequence[str] = ("k", "v"), start: int = 0,
              on_layer: Callable[[int, torch.cuda.Event | None], object] | None = None,
              background: Literal[False] = False, threads: int = 0,
              staging_bytes: int | None = None) -> list[torch.cuda.Event | None]: ...
@overload
def load_into(path: str | os.PathLike[str] | _kvfile.Reader, destination: Iterable[torch.Tensor],
              block_ids: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              slot_mapping: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              layout: Literal["vllm", "nhd", "hnd"] = "vllm", heads: tuple[int, int] | None = None,
              streams: Sequence[str] = ("k", "v"), start: int = 0,
              on_layer: Callable[[int, torch.cuda.Event | None], object] | None = None, *, background: Literal[True],
              threads: int = 0, staging_bytes: int | None = None) -> LayerLoad: ...
def load_into(path: str | os.PathLike[str] | _kvfile.Reader, destination: Iterable[torch.Tensor],
              block_ids: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              slot_mapping: Sequence[int] | npt.NDArray[np.integer] | torch.Tensor | None = None,
              layout: Literal["vllm", "nhd", "hnd"] = "vllm", heads: tuple[int, int] | None = None,
              streams: Sequence[str] = ("k", "v"), start: int = 0,
              on_layer: Callable[[int, torch.cuda.Event | None], object] | None = None, background: bool = False,
              threads: int = 0, staging_bytes: int | None = None) -> list[torch.cuda.Event | None] | LayerLoad:
    """Reads tokens [start, ...) of a .kv file straight into a paged KV cache,
    layer by layer. path: the file's path, or a reader kvfile.open(path)
    returned, which load_into uses and leaves open (for the caller to close).
    A caller that has the file open already (to match a prompt's tokens with
    longest_common_prefix, say) saves the open's scan of the file, and a
    reader that has read with several threads before keeps its reader threads
    and their file handles: the call starts none and opens nothing, and
    layer 0 is in place that much sooner (docs/gpu.md).
    destination: one tensor per layer, in `layout`:
      "vllm": [2, num_blocks, block_size, heads, head_dim]
      "nhd":  [num_pages, 2, page_size, heads, head_dim] (FlashInfer)
      "hnd":  [num_pages, 2, heads, page_size, head_dim] (FlashInfer)
    index 0 of the "2" dimension takes streams[0] (keys), 1 streams[1]
    (values); the destination's dtype is the output dtype. Token i goes to
    slot_mapping[i] (block * block_size + offset), or to block
    block_ids[i // block_size] at offset i % block_size. heads=(start, stop):
    only those rows (KV heads) of each token, as a tensor-parallel rank
    holds them; the destination has stop - start heads.
    On CUDA the layers are read, copied and decoded on a copy stream as load
    does (staging_bytes: as for load), layer 0 first and alone (in
    FIRST_LAYER_SLICES token slices, each copied and decoded while the next
    is read), so that it is ready first (fp8 and nvfp4 decoded on the GPU,
    bit-exact with the library); the slot indices are made while layer 0's
    first slice is read; layer i's CUDA event (timing enabled) is recorded once its rows are in place,
    and on_layer(i, event) is called then. background=True runs the load in
    a thread and returns a LayerLoad (wait_for_layer(i), result(); they
    raise the load's error, a missing file included); else the
    call returns the events when every layer is in place. On the CPU
    destination tensors are filled directly and the events are None."""
    torch = _torch()
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, not {layout!r}")
    destination = list(destination)
    device = destination[0].device
    dtype = destination[0].dtype
    _np_dtype_name(torch, dtype)

    # Below, `torch` is the module _torch() returned, a local: the nested
    # annotations say Any where they would name its types.
    def run(ready: Callable[[int, Any], None]) -> None:
        with _open(path) as reader:
            _warn_if_rotated(reader, reader.path)
            geometry = reader.geometry
            layers = geometry["layers"]
            if len(destination) != layers:
                raise ValueError(f"destination has {len(destination)} layers, the file {layers}")
            specs = {s["name"]: s for s in geometry["streams"]}
            for name in streams:
                if name not in specs:
                    raise ValueError(f"the file has no stream {name!r} (it has {', '.join(specs)})")
            stop = len(reader.tokens)
            tokens = stop - start
            lo, hi = (0, specs[streams[0]]["rows_per_token"]) if heads is None else heads
            which = {name: i for i, name in enumerate(streams)}
            slots: dict[str, Any] = {}

            def prepare() -> None:
                slots["blk"], slots["off"] = _slot_indices(torch, layout, destination, device, tokens, block_ids,
                                                           slot_mapping)

            def sink(name: str, first: int, last: int, t0: int, t1: int, values: Any) -> None:
                if name not in which:
                    return
                values = values[:, :, lo:hi]
                blk, off = slots["blk"][t0:t1], slots["off"][t0:t1]
                for layer in range(first, last):
                    d = destination[layer]
                    v = values[layer - first]
                    if layout == "vllm":
                        d[which[name], blk, off] = v
                    elif layout == "nhd":
                        d[blk, which[name], off] = v
                    else:
                        d[blk, which[name], :, off] = v

            if device.type == "cuda":
                dev = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())

                def part_done(first: int, last: int, stream: Any) -> None:
                    for layer in range(first, last):
                        event = torch.cuda.Event(enable_timing=True)
                        event.record(stream)
                        ready(layer, event)
                        if on_layer is not None:
                            on_layer(layer, event)

                with _staging_lock:
                    lock = _device_locks.setdefault(dev.index, threading.Lock())
                with lock:
                    _load_cuda(torch, reader, dev, dtype, _np_dtype_name(torch, dtype), start, stop, threads,
                               STAGING_BYTES if staging_bytes is None else staging_bytes, None, sink, part_done,
                               first_slices=FIRST_LAYER_SLICES, prepare=prepare)
            else:
                prepare()
                out = _load_cpu(torch, reader, dtype, _np_dtype_name(torch, dtype), start, stop, threads)
                for name in streams:
                    sink(name, 0, layers, 0, tokens, out[name].to(device))
                for layer in range(layers):
                    ready(layer, None)
                    if on_layer is not None:
                        on_layer(layer, None)

    if background:  # one readiness per destination layer (run checks the count against the file's)
        return LayerLoad(len(destination), run)
    events: list[Any] = []
    run(lambda layer, event: events.append(event))
    return events
