"""The wire format between client and worker, version 1. No pickle, ever.

A message is a ZeroMQ multipart message: one *header* frame, then zero or more *buffer* frames.
(On the worker's ROUTER socket a routing identity frame comes first; it is transport, not format.)

The header is a msgpack map:

=========  ==================================================================================
``v``      int, the wire version (``VERSION``). Any other version is answered with an error.
``t``      str, the message type. Client to worker: ``hello``, ``call``, ``stats``, ``stage``.
           Worker to client: ``ready``, ``result``, ``error``, ``stats``.
``id``     int >= 0, the request id. A reply carries the id of its request; replies are matched
           by id, never by order, so a late reply to an abandoned request is recognised and dropped.
=========  ==================================================================================

Per type:

- ``hello``: nothing more. Answered with ``ready`` once the worker is warm, and only after a health
  check that does real device work (a small matmul through the same path as a call, its answer
  compared exactly); a worker that fails it answers ``error`` of kind ``unhealthy``.
- ``ready``: ``pid`` (int), ``device`` (str), ``torch`` (str), ``bench`` (the worker's self-benchmark:
  one float64 GFLOP/s per family, ``points`` per "family/dtype" and ``ops`` per "op/dtype", each a
  list of [flops, seconds]; a CPU worker adds ``others_busy``, the share of its CPUs other processes
  used during each try, and ``contended`` where no try ran clean; ``cached_s``: the age of a
  benchmark the worker reused from its host's cache instead of measuring; the planner reads what it
  recognises and checks each value), ``health_s`` (seconds the health
  check took, so that a client timing a hello as a round trip can take it off).
- ``call``: ``op`` (str, a kernel id from the catalog), ``params`` (map of str to msgpack scalars,
  lists and nil), ``arrays`` (list of array metas, one per buffer frame, in order), ``layouts``
  (list, one per result array: ``"C"``, ``"F"``, or a list giving the axis order from the slowest
  to the fastest varying axis; a result asked for in such an order comes back transposed to it, in
  C order, and the client transposes it back), ``results`` (list, one per result array: ``{"dtype", "shape"}``,
  what the client expects back). The declared results count against the worker's byte budget
  before the kernel runs, and a kernel whose results differ from them is answered with an error,
  never sent.
- ``result``: ``arrays`` (array metas of the result buffers), ``timing`` (map of phase name to
  seconds measured on the worker: ``h2d``, ``kernel``, ``d2h``).
- ``stats``: asked with nothing more; answered with ``calls``, ``bytes_in``, ``bytes_out``: the
  call messages the worker has answered and their bytes as counted at its socket (headers included).
- ``error``: ``kind`` (one of ``ERROR_KINDS``), ``exc`` (the exception type's name), ``msg`` (str).
- ``stage`` (opt-in, :doc:`docs/stages.md`): a function run on the worker. ``fn``: ``{"module",
  "qualname", "hash"}`` (by reference) or nil (by value, inside the payload); ``versions``: the
  client's ``{"python", "cloudpickle", "numpy"}``; ``deadline_s`` (number). Its first array is the
  payload (``|u1``: the cloudpickled function where by value and the arguments, each ndarray in it
  standing for one of the arrays after it, which may be references). Answered with ``result``: its
  first array the pickled return value (or exception, ``raised: true``), ``nres`` arrays it refers
  to, then the arguments the stage changed in place, their indices in ``changed``; or ``error`` of
  kind ``refused`` (no ``--allow-code``, an unauthenticated principal, other versions) or
  ``code_missing`` (the reference does not import to the same source here: send it by value).
  Only these messages carry pickles, only where both sides were started for stages.

An array meta is a map ``{"dtype": str, "shape": [int, ...], "order": "C" | "F"}``. ``dtype`` is a
NumPy dtype string from ``DTYPES`` (native byte order only); the rank is at most ``MAX_NDIM``;
its buffer frame holds exactly
``prod(shape) * itemsize`` bytes laid out in ``order``. Residency adds two optional keys:
``fp``, the array's content fingerprint (32 hex digits, :func:`fusion_shim.protocol.fingerprint.fingerprint`),
which in a call asks the worker to keep the array and in a result says the worker kept it; and
``ref: true``, in a call only, for an array sent by reference: it has *no* buffer frame and the worker
uses the copy it holds under ``fp``, or answers ``error`` with kind ``missing`` and ``missing``, the
list of fingerprints it does not hold (the client then resends them once, by value). Buffer frames
follow the header in the order of the metas that are not references. A ``result`` may carry
``kept`` (the call's input fingerprints the worker now holds) and ``evicted`` (fingerprints it
dropped from its store to make room), and ``finite: true``: no floating result holds inf or nan.

Shared memory (:mod:`fusion_shim.transport.shm`), on a same-host link that negotiated it:

- ``hello`` may carry ``shm``: ``{"boot": str, "probe": str, "token": str}`` (the client's boot id
  and a probe segment holding ``token``); ``ready`` then carries ``shm``: ``{"ok": bool}`` and, when
  not ok, ``why`` (str). Without ``"ok": true`` nothing below is sent.
- an array meta may carry ``shm``: ``{"name": str, "offset": int}``: its bytes are in that segment
  at that offset, and it has *no* buffer frame (like ``ref``; a meta is never both). In a ``call``
  they are inputs in client segments (role ``i``); in a ``result``, results written into a slot the
  call offered. Their bytes count against ``max_bytes`` like a frame's, before anything is mapped.
- ``call`` may carry ``out_shm``: a list, one per declared result, of nil or ``{"name": str,
  "offset": int, "nbytes": int}``: a client segment (role ``o``) the result may be written into when
  it has exactly ``nbytes``; and ``shm_drop``: segment names the worker should unmap (any message
  may carry it).
- any reply may carry ``shm_mapped``: the segment names the worker mapped while handling it; the
  client then unlinks those names.

The stage pipe (:mod:`fusion_shim.worker.stages` to its stage process, one socket pair, each message
one ``send_bytes``; built and read by :func:`fusion_shim.protocol.messages.send_stage_job` and its
neighbours). A *job*: a msgpack map ``{"fn": <a stage's fn, as above>, "metas": [array meta, ...]}``,
then the payload, then one buffer per meta that is not a reference (``ref: true``: the process holds
it under ``fp`` from an earlier job). An *answer*: a msgpack map, one of ``{"missing": [fp, ...]}``,
``{"code_missing": str}``, or ``{"ok": true, "raised": bool, "nres": int, "changed": [int, ...],
"stage_s": float, "note": str, "metas": [array meta, ...]}`` followed by the pickled value and one
buffer per meta (the ``nres`` results, then the changed arguments). The worker reads an answer as
it reads a message from a client: the header at most ``MAX_HEADER`` bytes, each meta checked and
the total against its budget before a buffer is read, each buffer exactly its meta's size.

Segment names are validated (``transport.shm.NAME_RE``) and bounds-checked by the side that maps
them; a message with ``shm`` metas where nothing was negotiated is a :class:`WireError`. Residency
and shared memory compose: a reference stays a reference; only bytes that travel go by segment.

Everything is validated before anything is allocated (:func:`decode`): the frame count (at most
``MAX_FRAMES``), the header's size, its types, the version, the dtype list, the rank, the shape's
product against the frame's length, and the total against ``max_bytes`` (the worker's budget; the
worker also sets it as ZeroMQ's ``MAXMSGSIZE``, so a larger frame is refused by the socket before
it is buffered). A message that fails raises :class:`WireError`; the worker answers it with an
``error`` reply and stays up. Nothing here imports pickle, cloudpickle or marshal (a test checks).

Buffers are sent zero-copy above ``ZERO_COPY_MIN`` bytes (below it a copy is cheaper than the
bookkeeping; see shared/LIMITS.md) and received zero-copy: a received array is a writable view on
the ZeroMQ frame, so a result reaches the program without another copy.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import msgpack
import numpy as np

VERSION = 1
ZERO_COPY_MIN = 64 * 1024
MAX_HEADER = 1 << 20
MAX_NDIM = 64
MAX_FRAMES = 1 + 64  # a header and at most 64 buffers: more is refused before any is looked at
MESSAGE_TYPES = ("hello", "ready", "call", "result", "error", "stats", "stage")
ERROR_KINDS = ("bad_request", "version", "unknown_op", "kernel_error", "out_of_memory", "missing", "busy",
               "unhealthy", "refused", "code_missing")
FP_LEN = 32  # hex digits of an xxh3-128 fingerprint
PLAIN_META = frozenset(("dtype", "shape", "order"))  # the meta of an array in its frame, untagged


class Ref(NamedTuple):
    """An input sent by reference: the worker must already hold it under ``fp``."""
    fp: str
    dtype: np.dtype
    shape: tuple
    order: str
DTYPES = frozenset(
    np.dtype(t).str
    for t in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
)
_DTYPE_OF = {s: np.dtype(s) for s in DTYPES}  # D41: made once, not per meta
_HEX = frozenset("0123456789abcdef")


class WireError(ValueError):
    """A message does not follow the format; the text says which rule it broke."""


class Unencodable(Exception):
    """A header this side cannot encode (msgpack refuses a value: an int past 64 bits, an object):
    nothing was sent, the peer is not at fault."""


def to_wire(arr: np.ndarray) -> tuple[dict, Any]:
    """An array's meta and a buffer over its bytes; copies only when the array is neither C- nor
    F-contiguous or not in native byte order."""
    dt = arr.dtype  # D41: each attribute read once (a dtype's ``str`` is made at each read)
    if not dt.isnative:
        arr = arr.astype(dt.newbyteorder("="))
        dt = arr.dtype
    flags = arr.flags
    if flags.c_contiguous:
        order = "C"
    elif flags.f_contiguous:
        order = "F"
    else:
        arr = np.ascontiguousarray(arr)
        order = "C"
    code = dt.str
    if code not in DTYPES:
        raise WireError(f"dtype {dt} cannot travel on the wire")
    if not arr.size:
        buf = b""
    elif order == "C":
        buf = np.frombuffer(arr, np.uint8)  # D41: one view where two made it (a reshape, then a view)
    else:
        buf = arr.reshape(-1, order="A").view(np.uint8)
    return {"dtype": code, "shape": list(arr.shape), "order": order}, buf


Place = Callable[[dict, Any], "dict | None"]


def encode(header: dict, arrays: Iterable[np.ndarray] = (), fps: Sequence[str | None] | None = None,
           refs: Iterable[int] = (), place: Place | None = None) -> list:
    """Header plus buffer frames for ``arrays``; the array metas go into ``header["arrays"]``.
    ``fps[i]`` tags array *i* with its fingerprint; indices in ``refs`` travel as references."""
    return encode_wired(header, [to_wire(a) for a in arrays], fps, refs, place)


def encode_wired(header: dict, wired: Sequence[tuple[dict, Any]], fps: Sequence[str | None] | None = None,
                 refs: Iterable[int] = (), place: Place | None = None) -> list:
    """:func:`encode` for arrays already through :func:`to_wire` (the fingerprint needed them).
    ``place(meta, buf)`` may put a buffer into shared memory and return its ``shm`` locator;
    None sends it as a frame. References are never placed."""
    refs = set(refs)
    metas, bufs = [], []
    for i, (meta, buf) in enumerate(wired):
        fp = fps[i] if fps is not None else None
        if fp is not None:
            meta = {**meta, "fp": fp}
        if i in refs:
            meta = {**meta, "ref": True}
        else:
            loc = place(meta, buf) if place is not None else None
            if loc is None:
                bufs.append(buf)
            else:
                meta = {**meta, "shm": loc}
        metas.append(meta)
    full = {"v": VERSION, **header, "arrays": metas}
    try:
        head = msgpack.packb(full, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Unencodable(f"{type(exc).__name__}: {exc}") from None
    return [head, *bufs]


def frame_view(frame: Any) -> memoryview:
    """A frame's bytes, not copied: a ``zmq.Frame``'s buffer, or a memoryview of bytes or a buffer."""
    buf = getattr(frame, "buffer", None)  # zmq.Frame
    return buf if buf is not None else memoryview(frame)


def decode_header(frame: Any) -> dict:
    header = unpack_map(frame)
    version = header.get("v")
    if version != VERSION:
        raise WireError(f"wire version {version!r} is not supported; this side speaks {VERSION}")
    kind = header.get("t")
    if kind not in MESSAGE_TYPES:
        raise WireError(f"message type {kind!r} is unknown; valid: {', '.join(MESSAGE_TYPES)}")
    rid = header.get("id")
    if not isinstance(rid, int) or isinstance(rid, bool) or rid < 0:
        raise WireError("request id must be an int >= 0")
    return header


_STAGE_TYPE = msgpack.packb("t") + msgpack.packb("stage")


def pack_map(header: dict) -> bytes:
    """A stage pipe's header (no version: both ends are one package, started together)."""
    return msgpack.packb(header, use_bin_type=True)


def unpack_map(raw: Any) -> dict:
    """A header's map, within ``MAX_HEADER`` bytes (a message's, then checked further; a stage pipe's)."""
    view = frame_view(raw)
    if view.nbytes > MAX_HEADER:
        raise WireError(f"header of {view.nbytes} bytes exceeds {MAX_HEADER}")
    try:
        header = msgpack.unpackb(view, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types on malformed input
        raise WireError(f"header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    return header


def checked_metas(metas: Any, max_bytes: int) -> list[tuple[np.dtype, tuple[int, ...], str, int]]:
    """Array metas another process sent, each checked and their total against ``max_bytes``, before
    any buffer is read: (dtype, shape, order, bytes) per meta."""
    if not isinstance(metas, list) or len(metas) > MAX_FRAMES - 1:
        raise WireError(f"'metas' must be a list of at most {MAX_FRAMES - 1} metas")
    out = []
    for meta in metas:
        dt, shape, order = _check_meta(meta, None)
        out.append((dt, shape, order, math.prod(shape) * dt.itemsize))
    total = sum(n for *_, n in out)
    if total > max_bytes:
        raise WireError(f"arrays of {total} bytes, over the limit of {max_bytes}")
    return out


def may_be_stage(frame: Any) -> bool:
    """Whether a header frame may be a ``stage`` request, without decoding it: its type as this
    package encodes it. A false yes is decoded and found not a stage; a stage encoded otherwise
    is refused by the call path, never run."""
    raw = frame_view(frame)
    return raw.nbytes <= MAX_HEADER and _STAGE_TYPE in raw.tobytes()


def _is_fp(fp: Any) -> bool:
    return isinstance(fp, str) and len(fp) == FP_LEN and _HEX.issuperset(fp)


def _check_fp(fp: Any) -> str:
    if not _is_fp(fp):
        raise WireError(f"fingerprint must be {FP_LEN} lowercase hex digits")
    return fp


def _dtype_shape(meta: Any) -> tuple[np.dtype, tuple[int, ...], int]:
    if not isinstance(meta, dict):
        raise WireError("array meta is not a map")
    dtype, shape = meta.get("dtype"), meta.get("shape")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(f"dtype {dtype!r} is not accepted")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise WireError(f"shape must be a list of at most {MAX_NDIM} ints")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise WireError("shape entries must be ints >= 0")
    dt = np.dtype(dtype)
    return dt, tuple(shape), math.prod(shape) * dt.itemsize


def declared_results(metas: Any, max_bytes: int) -> list[tuple[np.dtype, tuple[int, ...]]]:
    """A call's ``results`` field checked: a list of ``{"dtype", "shape"}`` whose bytes together stay
    under ``max_bytes``; returns (dtype, shape) pairs."""
    if not isinstance(metas, list) or len(metas) > MAX_FRAMES - 1:
        raise WireError(f"'results' must be a list of at most {MAX_FRAMES - 1} metas")
    checked = [_dtype_shape(m) for m in metas]
    total = sum(n for _, _, n in checked)
    if total > max_bytes:
        raise WireError(f"declared results need {total} bytes, over the limit of {max_bytes}")
    return [(dt, shape) for dt, shape, _ in checked]


def _check_meta(meta: Any, nbytes: int | None) -> tuple[np.dtype, tuple[int, ...], str]:
    """Validate a meta against its buffer's length (``None`` for a reference: no buffer)."""
    dt, shape, expected = _dtype_shape(meta)
    if "fp" in meta:
        _check_fp(meta["fp"])
    order = meta.get("order")
    if order not in ("C", "F"):
        raise WireError(f"order {order!r} is invalid; valid: C, F")
    if nbytes is not None and expected != nbytes:
        raise WireError(f"buffer holds {nbytes} bytes but shape {list(shape)} of {dt.str} needs {expected}")
    return dt, shape, order


def decode(frames: Sequence[Any], max_bytes: int = 1 << 40, segments: Any = None,
           header: dict | None = None) -> tuple[dict, list[np.ndarray]]:
    """Validate a message and return its header and its arrays (zero-copy views on the frames).
    ``segments`` resolves ``shm`` metas (``segments.array(loc, dtype, shape, order)``): the worker's
    mapper or the client's request; without it a ``shm`` meta is an error. ``header``: what
    :func:`decode_header` already made of ``frames[0]``."""
    if not frames:
        raise WireError("empty message")
    if len(frames) > MAX_FRAMES:
        raise WireError(f"{len(frames)} frames, over the limit of {MAX_FRAMES}")
    if header is None:
        header = decode_header(frames[0])
    metas = header.get("arrays", [])
    plain = _plain_arrays(frames, metas, max_bytes)
    if plain is not None:
        return header, plain
    if not isinstance(metas, list):
        raise WireError("'arrays' must be a list")
    if len(metas) > MAX_FRAMES - 1:
        raise WireError(f"{len(metas)} array metas, over the limit of {MAX_FRAMES - 1}")
    bufs = [frame_view(f) for f in frames[1:]]
    is_ref = [isinstance(m, dict) and m.get("ref") is True for m in metas]
    is_shm = [isinstance(m, dict) and "shm" in m for m in metas]
    if header["t"] not in ("call", "stage") and any(is_ref):
        raise WireError("only a call or a stage may send arrays by reference")
    if any(is_shm):
        if segments is None:
            raise WireError("an array in shared memory, but shared memory was not negotiated")
        if header["t"] not in ("call", "result") or any(r and s for r, s in zip(is_ref, is_shm)):
            raise WireError("shared memory carries only call inputs and results, never a reference")
    inline = [not (r or s) for r, s in zip(is_ref, is_shm)]
    if sum(inline) != len(bufs):
        raise WireError(f"{sum(inline)} array metas with data but {len(bufs)} buffer frames")
    total = sum(b.nbytes for b in bufs)
    if total > max_bytes:
        raise WireError(f"message carries {total} bytes, over the limit of {max_bytes}")
    frame_of = iter(bufs)
    checked = []
    for meta, ref, shm in zip(metas, is_ref, is_shm):
        if ref:
            checked.append((_check_meta(meta, None), None))
            _check_fp(meta.get("fp"))
        elif shm:
            checked.append((_check_meta(meta, None), None))
        else:
            buf = next(frame_of)
            checked.append((_check_meta(meta, buf.nbytes), buf))
    # bytes in segments count like bytes in frames: checked before anything is mapped
    total += sum(math.prod(shape) * dt.itemsize for s, ((dt, shape, _), _) in zip(is_shm, checked) if s)
    if total > max_bytes:
        raise WireError(f"message carries {total} bytes, over the limit of {max_bytes}")
    arrays: list = []
    for meta, ((dt, shape, order), buf) in zip(metas, checked):
        if buf is None:
            if "shm" in meta:
                arrays.append(segments.array(meta["shm"], dt, shape, order))
            else:
                arrays.append(Ref(meta["fp"], dt, shape, order))
            continue
        flat = np.frombuffer(buf, dtype=dt) if buf.nbytes else np.empty(0, dt)
        arrays.append(flat.reshape(shape, order=order))
    return header, arrays


def _plain_arrays(frames: Sequence[Any], metas: Any, max_bytes: int) -> list | None:
    """D41: :func:`decode`'s arrays where every one is inline and every meta passes its checks, in
    one pass; None for anything else, which the full checks then refuse or accept (never a
    different answer: this path only accepts what they accept)."""
    if type(metas) is not list or len(metas) != len(frames) - 1:
        return None
    checked = []
    total = 0
    for meta, frame in zip(metas, frames[1:]):
        if type(meta) is not dict or "shm" in meta or "ref" in meta:
            return None
        dtype, shape, order = meta.get("dtype"), meta.get("shape"), meta.get("order")
        dt = _DTYPE_OF.get(dtype) if type(dtype) is str else None
        if dt is None or type(shape) is not list or len(shape) > MAX_NDIM or (order != "C" and order != "F"):
            return None
        nbytes = dt.itemsize
        for d in shape:
            if type(d) is not int or d < 0:
                return None
            nbytes *= d
        if "fp" in meta and not _is_fp(meta["fp"]):
            return None
        buf = frame_view(frame)
        if buf.nbytes != nbytes:
            return None
        total += nbytes
        checked.append((buf, dt, shape, order))
    if total > max_bytes:
        return None
    return [(np.frombuffer(buf, dtype=dt) if buf.nbytes else np.empty(0, dt)).reshape(shape, order=order)
            for buf, dt, shape, order in checked]
