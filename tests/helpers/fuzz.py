"""Fuzzing a live worker (issue 8): seeded random mutation of valid messages.

Valid messages come from the real client path (catalog ``prepare`` and ``client.remote.call_message``)
for products, linalg, fft, the amplifiers (``kron``, ``outer``, an outer ``einsum``) and SciPy rows,
plus ``hello``. Each fuzz message is one of them mutated by 1-3 operators: header bytes flipped, cut
or extended; a header field replaced by a hostile value, removed, or a junk field added; array
metas and params mutated (dtype, shape, order, sizes); an input turned into a reference to a guessed
fingerprint, tagged with a right, wrong or malformed fingerprint, or said to be in a shared-memory
segment; buffer frames dropped, duplicated, cut, extended, swapped, emptied; too many frames;
garbage frames.

Plain seeded mutation (not hypothesis) so that a 10,000-message run is one reproducible stream:
``seed`` and the message index identify every message. The verdicts:

- a message that :func:`fusion_shim.protocol.wire.decode` refuses locally (malformed on the wire) must be
  answered with ``error``;
- a message the wire accepts may be answered with ``result`` (the mutation kept it meaningful)
  only with exactly the results it declares, or with ``error``;
- every message gets exactly one reply, the worker keeps its pid, and its memory returns to within
  5% of the baseline.
"""
from __future__ import annotations

import copy
import inspect
import os
import random
import time
from typing import Any

import msgpack
import numpy as np

from fusion_shim import catalog
from fusion_shim.client import remote
from fusion_shim.protocol import wire

HOSTILE = [None, True, False, -1, 0, 1, 3, 65, 2**31, 2**63 - 1, -2**63, 2**64 - 1, 1.5, float("nan"),
           float("inf"), "", "x", "matmul", "<f8", "|O", "C", "F", "\x00\xff", "a" * 300, [], [1], [-1],
           [2**62, 2**62], list(range(70)), {}, {"a": 1}, {"dtype": "<f8"}, b"\x00" * 8, [[1, 2], [3]]]
DTYPE_POOL = ["<f8", "<f4", "<c16", "|b1", "|i1", "<u8", "<f2", "|O", "<f16", ">f8", "V8", "S5", "<M8[s]",
              "U3", "x", "", None, 8, ["<f8"]]
OPS = ["matmul", "dot", "linalg.inv", "linalg.svd", "fft.fft1", "nope", "", "__class__", "linalg.solve "]


def _call(name: str, *args: Any, **kwargs: Any) -> catalog.Prepared:
    spec = catalog.BY_NAME[name]
    module = __import__(spec.module, fromlist=[spec.attr])
    func = getattr(module, spec.attr)
    return catalog.prepare(spec, inspect.signature(func), args, kwargs)


def base_messages() -> list[tuple[str, list[bytes]]]:
    """One valid message per catalog row (small arrays), and hello; frames as bytes."""
    r = np.random.default_rng(0)
    m = r.standard_normal((12, 12))
    spd = m @ m.T + 12 * np.eye(12)
    x = r.standard_normal(32)
    z = x + 1j * r.standard_normal(32)
    preps = [
        _call("numpy.matmul", m, m), _call("numpy.matmul", m.astype(np.float32), m.astype(np.float32)),
        _call("numpy.dot", m, x[:12]), _call("numpy.tensordot", m, m, axes=1),
        _call("numpy.einsum", "ij,jk->ik", m, m), _call("numpy.linalg.solve", spd, m),
        _call("numpy.linalg.inv", spd), _call("numpy.linalg.svd", m),
        _call("numpy.linalg.svd", m, compute_uv=False), _call("numpy.linalg.eigh", spd),
        _call("numpy.linalg.cholesky", spd), _call("numpy.linalg.qr", m),
        _call("numpy.fft.fft", z), _call("numpy.fft.ifft", z, n=40), _call("numpy.fft.rfft", x),
        _call("numpy.fft.irfft", z[:17]), _call("numpy.fft.fft2", m), _call("numpy.fft.ifft2", m + 0j),
        _call("numpy.kron", m[:4, :4], m[:3, :3]), _call("numpy.outer", x, x[:20]),
        _call("numpy.einsum", "i,j->ij", x, x),
    ]
    try:
        import scipy.linalg  # noqa: F401  (the rows exist once scipy is importable)

        preps += [_call("scipy.linalg.solve", spd, m), _call("scipy.linalg.qr", m), _call("scipy.linalg.expm", m / 12)]
    except ImportError:
        pass
    out = [("hello", [msgpack.packb({"v": wire.VERSION, "t": "hello", "id": 1})])]
    for prep in preps:
        frames = remote.call_message(1, prep)
        out.append((prep.spec.kernel_id, [bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in frames]))
    return out


class Mutator:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def hostile(self) -> Any:
        return copy.deepcopy(self.rng.choice(HOSTILE))

    def mutate(self, frames: list[bytes], rid: int) -> tuple[list[bytes], str]:
        frames = list(frames)
        header = msgpack.unpackb(frames[0])
        header["id"] = rid
        frames[0] = msgpack.packb(header, use_bin_type=True)
        names = []
        for _ in range(self.rng.choice((1, 1, 2, 3))):
            op = self.rng.choice(self.OPERATORS)
            names.append(op)
            if op.startswith("hdr_"):
                try:
                    header = msgpack.unpackb(frames[0], strict_map_key=False)
                except Exception:
                    continue  # no longer msgpack: header operators do not apply
                if isinstance(header, dict):
                    header = getattr(self, op)(header)
                    drop = header.pop("_drop_frame", None)
                    frames[0] = msgpack.packb(header, use_bin_type=True)
                    if isinstance(drop, int) and 0 <= drop < len(frames) - 1:
                        del frames[1 + drop]
            else:
                frames = getattr(self, op)(frames)
        return frames, "+".join(names)

    # -- header-level (the header stays msgpack) ----------------------------------------------------
    def hdr_replace(self, h: dict) -> dict:
        h[self.rng.choice(["v", "t", "id", "op", "params", "layouts", "arrays", "results"])] = self.hostile()
        return h

    def hdr_remove(self, h: dict) -> dict:
        keys = [k for k in h if k != "id"] or list(h)
        h.pop(self.rng.choice(keys), None)
        return h

    def hdr_junk_key(self, h: dict) -> dict:
        h[self.rng.choice(["x", "pad", "__class__", "pickle", "results2"])] = self.hostile()
        return h

    def hdr_op(self, h: dict) -> dict:
        h["op"] = self.rng.choice(OPS)
        return h

    def hdr_version(self, h: dict) -> dict:
        h["v"] = self.rng.choice([0, 2, -1, "1", 1.0, None, 2**40])
        return h

    def hdr_type(self, h: dict) -> dict:
        h["t"] = self.rng.choice(["result", "ready", "error", "shutdown", "", None, 1, "hello", "call"])
        return h

    def hdr_meta(self, h: dict) -> dict:
        metas = h.get("arrays")
        if not isinstance(metas, list) or not metas:
            return self.hdr_replace(h)
        meta = metas[self.rng.randrange(len(metas))]
        if not isinstance(meta, dict):
            return h
        field = self.rng.choice(["dtype", "shape", "order", "shape_entry", "extra"])
        if field == "dtype":
            meta["dtype"] = self.rng.choice(DTYPE_POOL)
        elif field == "shape":
            meta["shape"] = self.rng.choice([[], [0], [1] * 65, [2**40, 2**40], "3x3", None, [1.5], [True],
                                             list(reversed(meta.get("shape") or [1]))])
        elif field == "shape_entry" and isinstance(meta.get("shape"), list) and meta["shape"]:
            i = self.rng.randrange(len(meta["shape"]))
            meta["shape"][i] = self.rng.choice([0, 1, -1, meta["shape"][i] + 1, meta["shape"][i] * 2, 2**62])
        elif field == "order":
            meta["order"] = self.rng.choice(["A", "K", "", None, 1, "c"])
        else:
            meta[self.rng.choice(["strides", "offset", "byteorder"])] = self.hostile()
        return h

    def hdr_results(self, h: dict) -> dict:
        res = h.get("results")
        if not isinstance(res, list) or not res or not isinstance(res[0], dict):
            h["results"] = self.hostile()
            return h
        meta = res[self.rng.randrange(len(res))]
        choice = self.rng.random()
        if choice < 0.3:
            meta["dtype"] = self.rng.choice(DTYPE_POOL)
        elif choice < 0.6 and isinstance(meta.get("shape"), list) and meta["shape"]:
            meta["shape"][self.rng.randrange(len(meta["shape"]))] = self.rng.choice([0, 1, 7, 2**20, 2**40, -3])
        elif choice < 0.8:
            res.append(copy.deepcopy(meta))
        else:
            res.pop()
        return h

    def hdr_params(self, h: dict) -> dict:
        params = h.get("params")
        if not isinstance(params, dict):
            h["params"] = self.hostile()
            return h
        keys = list(params) + ["n", "s", "axis", "axes", "cdtype", "mode", "UPLO", "subscripts"]
        key = self.rng.choice(keys)
        if key == "cdtype":
            params[key] = self.rng.choice(DTYPE_POOL)
        elif key in ("n", "s", "axis", "axes"):
            params[key] = self.rng.choice([None, -1, 0, 1, 5, 40, 65, 10**6, 2**31, 2**62, -2**63, [3, 3],
                                           [2**40, 1], [0, 1], [5], "n", 1.5])
        else:
            params[key] = self.hostile()
        return h

    def hdr_layouts(self, h: dict) -> dict:
        h["layouts"] = self.rng.choice([["F"], ["C", "C"], [[1, 0]], [[0, 0]], [["a"]], [[5, 9]], "C", [None],
                                        [], [[0, 1, 2]], ["A"]])
        return h

    def _a_meta(self, h: dict) -> tuple[int, dict] | None:
        metas = h.get("arrays")
        if not isinstance(metas, list) or not metas:
            return None
        i = self.rng.randrange(len(metas))
        return (i, metas[i]) if isinstance(metas[i], dict) else None

    def _fp(self) -> Any:
        return self.rng.choice([self.rng.randbytes(16).hex(), "0" * 32, "g" * 32, "ab", self.hostile()])

    def hdr_ref(self, h: dict) -> dict:
        """An input sent as a reference to a fingerprint: a guess (another principal's, or none)."""
        got = self._a_meta(h)
        if got is not None:
            got[1]["ref"], got[1]["fp"] = self.rng.choice([True, True, 1, "yes"]), self._fp()
            if self.rng.random() < 0.7:
                h["_drop_frame"] = got[0]  # a reference carries no buffer
        return h

    def hdr_fp(self, h: dict) -> dict:
        """An input tagged with a fingerprint: right, wrong or malformed."""
        got = self._a_meta(h)
        if got is not None:
            got[1]["fp"] = self._fp()
        h["keep"] = self.rng.choice([True, True, False, self.hostile()])
        return h

    def hdr_shm(self, h: dict) -> dict:
        """An input said to be in a shared-memory segment (never negotiated over tcp)."""
        got = self._a_meta(h)
        if got is not None:
            got[1]["shm"] = self.rng.choice([
                {"name": "fshm-1-2-3-i4", "offset": 0}, {"name": "../../etc/passwd", "offset": 0},
                {"name": "fshm-4026531836-1-1-o9", "offset": self.rng.choice([-1, 2**62, 7])}, self.hostile()])
        h["out_shm"] = self.rng.choice([None, [{"name": "fshm-1-2-3-o4", "offset": 0, "nbytes": 8}], self.hostile()])
        return h

    # -- frame-level -------------------------------------------------------------------------------
    def fr_flip(self, f: list[bytes]) -> list[bytes]:
        if not f[0]:
            return f
        h = bytearray(f[0])
        for _ in range(self.rng.randint(1, 8)):
            h[self.rng.randrange(len(h))] ^= 1 << self.rng.randrange(8)
        f[0] = bytes(h)
        return f

    def fr_cut_header(self, f: list[bytes]) -> list[bytes]:
        f[0] = f[0][: self.rng.randrange(len(f[0]))] if f[0] else f[0]
        return f

    def fr_extend_header(self, f: list[bytes]) -> list[bytes]:
        f[0] = f[0] + self.rng.randbytes(self.rng.randint(1, 64))
        return f

    def fr_garbage_header(self, f: list[bytes]) -> list[bytes]:
        f[0] = self.rng.choice([self.rng.randbytes(self.rng.randint(0, 200)), msgpack.packb(self.hostile()),
                                b"\x80\x04\x95" + self.rng.randbytes(20)])  # the last: a pickle opening
        return f

    def fr_drop(self, f: list[bytes]) -> list[bytes]:
        if len(f) > 1:
            del f[self.rng.randrange(1, len(f))]
        return f

    def fr_dup(self, f: list[bytes]) -> list[bytes]:
        f.insert(self.rng.randrange(1, len(f) + 1), f[self.rng.randrange(len(f))])
        return f

    def fr_cut_buffer(self, f: list[bytes]) -> list[bytes]:
        if len(f) > 1:
            i = self.rng.randrange(1, len(f))
            f[i] = f[i][: self.rng.choice([0, 1, len(f[i]) // 2, max(len(f[i]) - 1, 0)])]
        return f

    def fr_extend_buffer(self, f: list[bytes]) -> list[bytes]:
        if len(f) > 1:
            i = self.rng.randrange(1, len(f))
            f[i] = f[i] + self.rng.randbytes(self.rng.choice([1, 8, 1000, 1 << 16]))
        return f

    def fr_swap(self, f: list[bytes]) -> list[bytes]:
        if len(f) > 2:
            i, j = self.rng.sample(range(1, len(f)), 2)
            f[i], f[j] = f[j], f[i]
        else:
            f.append(f[0])
        return f

    def fr_many(self, f: list[bytes]) -> list[bytes]:
        return f + [b"\x00" * 8] * self.rng.choice([1, 63, 64, 70, 200])

    def fr_flip_buffer(self, f: list[bytes]) -> list[bytes]:
        # a valid message with other numbers in it: NaNs, infinities, denormals are fine to compute
        if len(f) > 1 and f[1]:
            b = bytearray(f[1])
            for _ in range(4):
                b[self.rng.randrange(len(b))] = self.rng.randrange(256)
            f[1] = bytes(b)
        return f

    OPERATORS = ["hdr_replace", "hdr_remove", "hdr_junk_key", "hdr_op", "hdr_version", "hdr_type", "hdr_meta",
                 "hdr_meta", "hdr_results", "hdr_results", "hdr_params", "hdr_params", "hdr_layouts",
                 "hdr_ref", "hdr_ref", "hdr_fp", "hdr_shm",
                 "fr_flip", "fr_cut_header", "fr_extend_header", "fr_garbage_header", "fr_drop", "fr_dup",
                 "fr_cut_buffer", "fr_extend_buffer", "fr_swap", "fr_many", "fr_flip_buffer"]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def run_fuzz(sock: Any, pid: int, n: int, seed: int, max_bytes: int, reply_timeout_s: float = 60.0) -> dict:
    """Send ``n`` mutated messages one at a time over ``sock`` (an authenticated DEALER) and judge
    every reply; returns the figures (``failures`` must be empty)."""
    base = base_messages()
    mut = Mutator(seed)

    def ask(frames: list) -> tuple[dict, list]:
        sock.send_multipart(frames)
        if not sock.poll(int(reply_timeout_s * 1000)):
            raise AssertionError("no reply")
        return wire.decode(sock.recv_multipart(copy=False))

    # baseline: every valid message answered properly, three rounds, then memory
    for _ in range(3):
        for name, frames in base:
            header, _ = ask(frames)
            assert header["t"] in ("ready", "result"), (name, header)
    baseline = rss_kib(pid)
    counts = {"wire_invalid": 0, "wire_invalid_error": 0, "valid_error": 0, "valid_result": 0, "valid_ready": 0}
    failures: list[str] = []
    kinds: dict[str, int] = {}
    t0 = time.perf_counter()
    peak = baseline
    for i in range(n):
        name, frames = base[mut.rng.randrange(len(base))]
        frames, how = mut.mutate(frames, rid=10 + i)
        try:
            local_header, _ = wire.decode(frames, max_bytes=max_bytes)
            invalid = False
        except wire.WireError:
            invalid, local_header = True, None
        try:
            header, arrays = ask(frames)
        except AssertionError as exc:
            failures.append(f"#{i} {name} {how}: {exc}; frames {[f[:200] for f in frames][:4]}")
            return {"failures": failures, "messages": i}
        except wire.WireError as exc:
            failures.append(f"#{i} {name} {how}: the reply is malformed: {exc}")
            continue
        kinds[header["t"] if header["t"] != "error" else "error:" + str(header.get("kind"))] = \
            kinds.get(header["t"] if header["t"] != "error" else "error:" + str(header.get("kind")), 0) + 1
        if invalid:
            counts["wire_invalid"] += 1
            if header["t"] == "error" and header.get("kind") in wire.ERROR_KINDS and header.get("msg"):
                counts["wire_invalid_error"] += 1
            else:
                failures.append(f"#{i} {name} {how}: malformed on the wire, answered {header}")
            continue
        if header["t"] == "error":
            counts["valid_error"] += 1
        elif header["t"] == "result":
            counts["valid_result"] += 1
            declared = local_header.get("results")
            got = [(a.dtype.str, list(a.shape)) for a in arrays]
            want = [(np.dtype(m["dtype"]).str, list(m["shape"])) for m in declared] if isinstance(declared, list) else None
            if local_header.get("t") != "call" or got != want:
                failures.append(f"#{i} {name} {how}: result {got} for a request declaring {want}")
        elif header["t"] == "ready" and local_header.get("t") == "hello":
            counts["valid_ready"] += 1
        else:
            failures.append(f"#{i} {name} {how}: answered {header['t']!r} to {local_header.get('t')!r}")
        if i % 500 == 0:
            peak = max(peak, rss_kib(pid))
    elapsed = time.perf_counter() - t0
    # the same valid load as the baseline, then memory again
    for _ in range(3):
        for name, frames in base:
            header, _ = ask(frames)
            if header["t"] not in ("ready", "result"):
                failures.append(f"after fuzzing, {name} answered {header}")
    after = rss_kib(pid)
    hello, _ = ask([msgpack.packb({"v": wire.VERSION, "t": "hello", "id": 7})])
    return {"messages": n, "seconds": elapsed, "per_message_ms": elapsed / max(n, 1) * 1e3, **counts,
            "reply_kinds": kinds, "rss_baseline_kib": baseline, "rss_after_kib": after, "rss_peak_kib": peak,
            "rss_ratio": after / baseline, "pid_after": hello.get("pid"), "failures": failures}


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSION_SHIM")}
    env["FUSION_SHIM"] = "0"
    return env
