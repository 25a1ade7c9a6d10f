# SPDX-License-Identifier: Apache-2.0
"""kvfile.torch: .kv files to and from torch tensors.

    load(path, device="cuda", dtype=torch.bfloat16, start=0, stop=None)
        -> {"tokens": int64 tensor [tokens], stream: tensor [layers, tokens, rows, width]}
    save(path, tensors, tokens, model="", fingerprint=0, dtype="e4m3")
    append(path, tensors, tokens)

torch is imported when one of these is called: `import kvfile` never needs it.

On a CUDA device, load reads fp8 streams as codes and scales (half the bytes
of bf16) into pinned staging buffers, a few layers at a time, copies each
part to the GPU asynchronously while the next part is read, and decodes on
the GPU exactly as the library decodes on the CPU (spec/CODEC.md): the code's
float32 value from a 256-entry table, times the row's float32 scale in
float32, clamped to the output dtype's finite range, rounded to nearest even
by the conversion. Raw streams, and nvfp4 streams (no GPU kernel for them
yet: the library dequantizes them on the host), are decoded on the CPU into
the staging buffers. Other devices: decoded on the CPU, then moved.
"""

import threading

import numpy as np

from . import _kvfile

# Bytes of pinned staging per part; two parts are in flight (double
# buffering). A layer larger than this makes a part of its own. Measured on
# an H200 host (docs/gpu.md): for a 32k-token llama-3.1-8b session (69 MB a
# layer) three layers a part load faster than one or two, and the two
# buffers stay under 512 MiB.
STAGING_BYTES = 256 << 20
_ALIGN = 256

_staging_lock = threading.Lock()
_staging = {}  # device index -> [_Pinned, _Pinned], reused across loads
_device_locks = {}  # device index -> lock: one CUDA load at a time uses a device's staging


def _torch():
    import torch  # noqa: PLC0415  (lazy on purpose: the package never requires torch)
    return torch


def _np_dtype_name(torch, dtype):
    """The name read_all takes for a torch output dtype."""
    names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
    if dtype not in names:
        raise TypeError(f"dtype must be torch.bfloat16, torch.float16 or torch.float32, not {dtype}")
    return names[dtype]


def _numpy_view(torch, t):
    """A numpy array sharing the memory of CPU tensor t (bf16 as int16 bits)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy()


def _finite_max(torch, dtype):
    """The largest finite value of a 16-bit output dtype (exact in float32), or None."""
    if dtype == torch.bfloat16:
        return float(np.frombuffer(np.uint32(0x7F7F0000).tobytes(), np.float32)[0])
    if dtype == torch.float16:
        return 65504.0
    return None


def dequantize(codes, scales, kind, dtype, table=None):
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
    limit = _finite_max(torch, dtype)
    if limit is not None:
        values.clamp_(-limit, limit)
    return values.to(dtype)


def load(path, device="cuda", dtype=None, start=0, stop=None, threads=0, staging_bytes=None, stats=None):
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


def _shape(spec, layers, tokens):
    return (layers, tokens, spec["rows_per_token"], spec["row_width"])


def _load_cpu(torch, reader, dtype, dtype_name, start, stop, threads):
    geometry = reader.geometry
    out = {s["name"]: torch.empty(_shape(s, len(s.get("layers", ())) or geometry["layers"], stop - start),
                                  dtype=dtype)
           for s in geometry["streams"]}
    reader.read_all(dtype=dtype_name, start=start, stop=stop, threads=threads,
                    out={name: _numpy_view(torch, t) for name, t in out.items()})
    return out


class _Layout:
    """Where each stream's part of `layers` layers lies in a staging buffer."""

    def __init__(self, streams, fp8, layers, tokens, out_size):
        self.entries = []  # (name, fp8 kind or None, shape, codes or rows offset, scales offset or None)
        offset = 0
        for s in streams:
            shape = _shape(s, layers, tokens)
            elements = int(np.prod(shape))
            if s["name"] in fp8:
                codes_at = offset
                offset = _round_up(offset + elements)
                scales_at = offset
                offset = _round_up(offset + elements // s["row_width"] * 4)
                self.entries.append((s["name"], s["dtype"], shape, codes_at, scales_at))
            else:
                self.entries.append((s["name"], None, shape, offset, None))
                offset = _round_up(offset + elements * out_size)
        self.bytes = offset


def _round_up(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _Pinned:
    """A page-locked host buffer of exactly nbytes: ordinary memory registered
    with CUDA (torch's pinned allocator would round it up to a power of two,
    doubling the host memory of a 3-layer part), or, where registering is not
    available, torch's pinned memory."""

    def __init__(self, torch, nbytes):
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

    def __del__(self):
        if self.registered:
            self._cudart.cudaHostUnregister(self.tensor.data_ptr())


def _pinned(torch, device, slot, nbytes):
    """Pinned staging buffer `slot` (0 or 1) of at least nbytes, kept for later loads."""
    with _staging_lock:
        bufs = _staging.setdefault(device.index, [None, None])
        if bufs[slot] is None or bufs[slot].tensor.numel() < nbytes:
            bufs[slot] = None
            bufs[slot] = _Pinned(torch, nbytes)
        return bufs[slot]


def release_staging():
    """Frees the pinned staging buffers load keeps between calls."""
    with _staging_lock:
        _staging.clear()


def _load_cuda(torch, reader, device, dtype, dtype_name, start, stop, threads, staging_bytes, stats):
    geometry = reader.geometry
    streams = geometry["streams"]
    layers, tokens = geometry["layers"], stop - start
    v1 = reader.info()["major_version"] == 1
    fp8 = {s["name"] for s in streams if not v1 and s["dtype"] in ("e4m3", "e5m2")}
    out_size = torch.empty((), dtype=dtype).element_size()
    out = {s["name"]: torch.empty(_shape(s, layers, tokens), dtype=dtype, device=device) for s in streams}
    if tokens == 0 or layers == 0:
        return out
    per_layer = _Layout(streams, fp8, 1, tokens, out_size).bytes
    part_layers = max(1, min(layers, staging_bytes // max(per_layer, 1)))
    layout = _Layout(streams, fp8, part_layers, tokens, out_size)
    tables = {kind: torch.from_numpy(_kvfile.fp8_decode_table(kind)).to(device)
              for kind in {s["dtype"] for s in streams if s["name"] in fp8}}
    copy_stream = torch.cuda.Stream(device)
    staging = [_pinned(torch, device, i, layout.bytes) for i in range(2)]
    pinned = [b.tensor for b in staging]
    host = [p.numpy() for p in pinned]
    gpu = [torch.empty(layout.bytes, dtype=torch.uint8, device=device) for _ in range(2)]
    done = [None, None]  # event: the slot's pinned buffer has been copied out
    fp8_names = [s["name"] for s in streams if s["name"] in fp8]
    raw_names = [s["name"] for s in streams if s["name"] not in fp8]
    timings = []  # (start event, end event, bytes) per copy, when stats is asked for
    # The GPU buffers and outputs are used on copy_stream only from here on.
    copy_stream.wait_stream(torch.cuda.current_stream(device))
    for part, first in enumerate(range(0, layers, part_layers)):
        last = min(layers, first + part_layers)
        n = last - first
        slot = part % 2
        if done[slot] is not None:
            done[slot].synchronize()
        # The part's views: shapes for n layers (the last part may be shorter).
        views = {}
        used = 0
        for name, kind, shape, a, b in layout.entries:
            shape = (n,) + shape[1:]
            elements = int(np.prod(shape))
            if kind is not None:
                views[name] = (kind, shape, a, b,
                               host[slot][a:a + elements].reshape(shape),
                               host[slot][b:b + elements // shape[-1] * 4].view(np.float32).reshape(shape[:-1]))
                used = max(used, b + elements // shape[-1] * 4)
            else:
                nbytes = elements * out_size
                view = host[slot][a:a + nbytes].view(np.int16 if out_size == 2 else np.float32)
                if dtype == torch.float16:
                    view = view.view(np.float16)
                views[name] = (None, shape, a, None, view.reshape(shape), None)
                used = max(used, a + nbytes)
        if fp8_names:
            reader.codes_all(start=start, stop=stop, threads=threads, layers=(first, last), streams=fp8_names,
                             out={name: (views[name][4], views[name][5]) for name in fp8_names})
        if raw_names:
            reader.read_all(dtype=dtype_name, start=start, stop=stop, threads=threads, layers=(first, last),
                            streams=raw_names, out={name: views[name][4] for name in raw_names})
        with torch.cuda.stream(copy_stream):
            g = gpu[slot]
            if stats is not None:
                timings.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), used))
                timings[-1][0].record(copy_stream)
            g[:used].copy_(pinned[slot][:used], non_blocking=True)
            if stats is not None:
                timings[-1][1].record(copy_stream)
            done[slot] = torch.cuda.Event()
            done[slot].record(copy_stream)
            for name, (kind, shape, a, b, _, _) in views.items():
                elements = int(np.prod(shape))
                if kind is not None:
                    codes = g[a:a + elements].view(shape)
                    scales = g[b:b + elements // shape[-1] * 4].view(torch.float32).view(shape[:-1])
                    out[name][first:last] = dequantize(codes, scales, kind, dtype, tables[kind])
                else:
                    out[name][first:last] = g[a:a + elements * out_size].view(dtype).view(shape)
    copy_stream.synchronize()
    if stats is not None:
        stats["parts"] = len(timings)
        stats["registered"] = all(b.registered for b in staging)
        stats["h2d_bytes"] = sum(n for _, _, n in timings)
        stats["h2d_seconds"] = sum(a.elapsed_time(b) for a, b, _ in timings) / 1e3
    return out


def _host_rows(torch, t, layers_tokens_check, name):
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


def _append(torch, writer, tensors, tokens):
    ids = tokens.detach().to("cpu").numpy() if hasattr(tokens, "detach") else np.asarray(tokens)
    count = len(ids)

    def check(name, layers, n):
        if n != count:
            raise ValueError(f"stream '{name}': {n} tokens, but {count} token ids")

    writer.append(ids, {name: _host_rows(torch, t, check, name) for name, t in tensors.items()})


def save(path, tensors, tokens, model="", fingerprint=0, dtype="e4m3", chunk_tokens=256, overwrite=False):
    """Writes a new .kv file from {stream: tensor [layers, tokens, rows, width]} (any
    device, float dtypes) and the token ids. dtype: the storage dtype of every
    stream ("e4m3", "e5m2", "bf16", "f16", "f32"), or a dict {stream: dtype}."""
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
        _append(torch, writer, tensors, tokens)


def append(path, tensors, tokens):
    """Appends tokens and their rows ({stream: tensor [layers, tokens, rows, width]})
    to an existing .kv file."""
    torch = _torch()
    with _kvfile.open_writer(str(path)) as writer:
        _append(torch, writer, tensors, tokens)
