"""The report's default layout: a title, a summary of at most SUMMARY_LINES lines, a table of
TABLE_COLUMNS columns, then notes and events, every line at most WIDTH characters (D280). What does
not fit is counted, never dropped unsaid: "(N more: fusion-shim report --full)". ``--full`` is
:func:`fusion_shim.reporting.format_table` with ``full=True`` (the wide table, every event, the
floors); ``--explain`` is :data:`EXPLAIN`.
Imported at exit: nothing here may exec() source text (see ``report/__init__``).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

WIDTH = 100  # D280: every line of the default report fits a terminal of this width
SUMMARY_LINES = 6  # D280: the lines between the title and the table
MORE = "({n} more: fusion-shim report --full)"
EVENTS_OF_A_KIND = 3  # events of one kind shown (same text but for its numbers); the rest counted
TOP_SITES = 3
TOP_REASONS = 5
# what the plain-words line says of the cold-worker wait (report.bottom.PARTS) where no worker was ever ready
WARM = "for the worker to warm"
NEVER_READY = "for a worker that never became ready"


def counts(o: dict[str, Any]) -> dict[str, int]:
    """One op's calls by category (D281), each call in exactly one: ``worker``; ``here`` (decided
    here or unsupported); ``fallback`` (meant for the worker, computed here after a fault);
    ``raised`` (NumPy raised the program's error); ``below_floor``; ``no_worker`` (under auto,
    before any worker was ready)."""
    return {"worker": o.get("worker", 0), "here": o.get("local", 0) + o.get("unsupported", 0),
            "fallback": o.get("fallback", 0), "raised": o.get("raised", 0),
            "below_floor": o.get("below_floor", 0), "no_worker": o.get("no_worker", 0)}


def bottom_words(line: str, worker: dict[str, Any] | None) -> str:
    """The plain-words line, its wait named for what it was: warming only where a worker became ready (D282)."""
    if worker is None or worker.get("ready_after_s") is None:
        return line.replace(WARM, NEVER_READY)
    return line


# -- fitting lines ----------------------------------------------------------------------------------
def clip(line: str, width: int = WIDTH) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def listed(head: str, items: list[str], width: int = WIDTH, sep: str = ", ") -> str:
    """``head`` and as many ``items`` as fit in ``width``, then how many more (D280)."""
    whole = head + sep.join(items)
    if len(whole) <= width:
        return whole
    out = head
    for i, item in enumerate(items):
        rest = len(items) - i - 1
        candidate = out + (sep if i else "") + item
        marker = " " + MORE.format(n=rest) if rest else ""
        if len(candidate) + len(marker) > width:
            if i == 0:
                return clip(candidate, width - len(" " + MORE.format(n=len(items) - 1))) + \
                    (" " + MORE.format(n=len(items) - 1) if len(items) > 1 else "")
            return out + " " + MORE.format(n=len(items) - i)
        out = candidate
    return out


def fold(line: str, width: int = WIDTH, lines: int = 2, indent: str = "    ") -> list[str]:
    """``line`` broken at spaces into at most ``lines`` lines of ``width``; the last clipped."""
    out, rest = [], line
    while len(rest) > width and len(out) < lines - 1:
        cut = rest.rfind(" ", 0, width + 1)
        if cut <= len(indent):
            break
        out.append(rest[:cut])
        rest = indent + rest[cut + 1:].lstrip()
    return [*out, clip(rest, width)]


def fitted(line: str, indent: str = "    ") -> list[str]:
    """A long line folded in two; longer, a list ("head: a, b, c") shows the parts that fit on one
    line and counts the rest (D280); anything else is folded and its second line clipped."""
    if len(line) <= WIDTH:
        return [line]
    if len(line) <= 2 * WIDTH - 2 * len(indent):
        return fold(line, indent=indent)
    head, sep, tail = line.partition(": ")
    parts = tail.split(", ") if sep else []
    if len(parts) > 2:
        return [listed(head + sep, parts)]
    return fold(line, indent=indent)


# -- numbers ----------------------------------------------------------------------------------------
def n(x: int) -> str:
    """A count in at most 5 characters."""
    return str(x) if x < 100_000 else f"{x / 1e3:.0f}k" if x < 10_000_000 else f"{x / 1e6:.0f}M"


def mb(x: float) -> str:
    if not x:
        return "-"
    return f"{x / 1e3:.1f}kB" if x < 1e5 else f"{x / 1e6:.1f}MB" if x < 1e8 else f"{x / 1e6:.0f}MB" if x < 1e9 \
        else f"{x / 1e9:.1f}GB"


def ms(s: float | None) -> str:
    """Seconds in at most 6 characters."""
    if not s:
        return "-"
    return f"{s * 1e3:.1f}ms" if s < 0.01 else f"{s * 1e3:.0f}ms" if s < 1 else f"{s:.2f}s" if s < 100 else f"{s:.0f}s"


def signed(s: float) -> str:
    return "0" if not s else ("+" if s > 0 else "-") + ms(abs(s))


def short_url(url: str | None, keep: int = 16) -> str:
    """A URL in about ``keep`` characters: its scheme and its end (an ipc:// socket's long run directory elided)."""
    if not url or len(url) <= keep + 8:
        return str(url)
    scheme, _, rest = url.partition("://")
    base = rest.rpartition("/")[2]
    return f"{scheme}://…/{base}" if 0 < len(base) <= keep else f"{scheme}://…{rest[-keep:]}"


# -- the default report ------------------------------------------------------------------------------
def compact(report: dict[str, Any], sm: dict[str, Any]) -> str:
    """The report printed at exit: every line at most WIDTH characters."""
    lines = fold(title(report))
    ops = report["ops"]
    lines += summary(report, sm)
    if not ops:
        lines.append("  no intercepted calls")
    else:
        lines += table(ops)
    lines += notes(report, sm)
    lines += events(report["events"])
    return "\n".join(clip(line) for line in lines)


def title(report: dict[str, Any]) -> str:
    w = report.get("worker")
    if w is None:
        where = "no worker"
    elif w.get("state") == "deferred":
        where = "embedded worker deferred (no GPU here)"
    else:
        device = (w.get("info") or {}).get("device", "?")
        ready = (f"ready {w['ready_after_s']:.2f}s" if w.get("ready_after_s") is not None
                 else f"never ready: {w.get('state')}" + (f", {w['not_ready']}" if w.get("not_ready") else ""))
        where = f"{short_url(w.get('url'))} ({device}, {ready})"
    return f"fusion_shim report · pid {report['pid']}, policy {report['policy']}, wall {report['wall_s']:.2f}s, {where}"


def summary(report: dict[str, Any], sm: dict[str, Any]) -> list[str]:
    """At most SUMMARY_LINES lines: the bottom line, time, bytes, against plain, start-up."""
    lines: list[str] = []
    if report["ops"]:
        lines += fold("  " + bottom_words(sm["bottom_line"], report.get("worker")))
        lines.append(time_line(report, sm))
        moved = bytes_line(sm)
        if moved:
            lines.append(moved)
        if report["policy"] != "local":  # the bottom line says it: nothing was offloaded
            lines.append(plain_line(sm.get("vs_plain") or {}))
    if report.get("startup"):
        lines.append(startup_line(report["startup"]))
    return lines[:SUMMARY_LINES]


def time_line(report: dict[str, Any], sm: dict[str, Any]) -> str:
    c = sm["calls"]
    here = c.get("local", 0) + c.get("unsupported", 0) + c.get("fallback", 0) + c.get("raised", 0)
    parts = [f"worker path {ms(sm['time_on_worker_path_s'])} ({n(c['worker'])} calls)"]
    if here or sm["time_computed_here_s"]:
        parts.append(f"here {ms(sm['time_computed_here_s'])} ({n(here)} calls)")
    worker = report.get("worker")
    if sm.get("time_waiting_for_cold_worker_s"):
        what = "cold-worker wait" if worker and worker.get("ready_after_s") is not None else "wait for a worker never ready"
        parts.append(f"{what} {ms(sm['time_waiting_for_cold_worker_s'])}")
    if c.get("verified"):
        parts.append(f"checks {ms(sm['time_checking_s'])} ({n(c['verified'])} answers, {n(c['mismatches'])} differed)")
    return listed("  time: ", parts)


def bytes_line(sm: dict[str, Any]) -> str | None:
    sent = sm.get("bytes_sent", 0) + sm.get("shm_sent", 0)
    received = sm.get("bytes_received", 0) + sm.get("shm_received", 0)
    if not sent and not received:
        return None
    parts = [f"sent {mb(sent)}", f"received {mb(received)}"]
    if sm.get("shm_sent") or sm.get("shm_received"):
        parts.append(f"via shm {mb(sm['shm_sent'])}/{mb(sm['shm_received'])}")
    res = sm.get("residency") or {}
    if res.get("resident_hits") or res.get("resends") or res.get("evictions"):
        parts.append(f"{n(res['resident_hits'])} resident ({mb(res['bytes_saved'])} not sent)")
    return listed("  moved: ", parts)


PART_NAMES = {"waiting_for_worker_s": "wait", "calls_run_here_s": "here", "worker_calls_s": "worker",
              "checks_s": "checks", "startup_s": "start-up"}


def plain_line(added: dict[str, Any]) -> str:
    """Against plain NumPy (report.bottom, D120): the total, its ESTIMATED share, and its parts."""
    estimated = added.get("estimated_s", 0.0)
    head = (f"  vs plain {signed(added.get('added_s', 0.0))}"
            + (f" ({ms(abs(estimated))} ESTIMATED)" if estimated else "") + ": ")
    by_size = sorted((added.get("parts_s") or {}).items(), key=lambda kv: -abs(kv[1]))  # the largest first
    parts = [f"{PART_NAMES.get(k, k.removesuffix('_s').replace('_', ' '))} {signed(v)}" for k, v in by_size if v]
    return listed(head, parts or ["nothing added"])


STARTUP_AT_START = ("bootstrap", "launcher", "interception")


def startup_line(startup: dict[str, float]) -> str:
    """The shim's own start, the parts at start first, then those made on first need."""
    first = sum(startup.get(p, 0.0) for p in STARTUP_AT_START)
    later = {p: s for p, s in startup.items() if p not in STARTUP_AT_START and s}
    head = f"  shim start-up: {ms(first)} at start"  # the total is the sum (--full)
    if not later:
        return head
    return listed(f"{head}; on first need: ", [f"{p} {ms(s)}" for p, s in later.items()])


# (header, width at least, what the cell shows); optional columns are shown where an op has one
COLUMNS = (("calls", True), ("worker", True), ("here", True), ("fallbk", False), ("raised", False),
           ("<floor", False), ("no-wkr", False), ("checked", False), ("moved", True), ("time", True))
TABLE_COLUMNS = 1 + len(COLUMNS)


def table(ops: dict[str, Any]) -> list[str]:
    """One row per op in WIDTH characters: its calls by category (:func:`counts`), bytes, time."""
    rows = []
    for name, o in ops.items():
        c = counts(o)
        checked = f"{n(o.get('verified', 0))}/{n(o['mismatches'])}!" if o.get("mismatches") else n(o.get("verified", 0))
        rows.append({"op": name.removeprefix("numpy."),
                     "calls": n(sum(c.values())), "worker": n(c["worker"]), "here": n(c["here"]),
                     "fallbk": n(c["fallback"]), "raised": n(c["raised"]), "<floor": n(c["below_floor"]),
                     "no-wkr": n(c["no_worker"]), "checked": checked,
                     "moved": mb(o["bytes_sent"] + o.get("shm_sent", 0) + o["bytes_received"] + o.get("shm_received", 0)),
                     "time": ms(o.get("wall_s"))})
    head = [h for h, always in COLUMNS if always or any(r[h] not in ("0", "-") for r in rows)]
    widths = {h: max(len(h), *(len(r[h]) for r in rows)) for h in head}
    rest = 2 + sum(widths.values())
    sep = 2 if rest + 2 * len(head) + 18 <= WIDTH else 1
    op_w = min(max(2, *(len(r["op"]) for r in rows)), WIDTH - rest - sep * len(head))

    def fmt(cells: dict[str, str]) -> str:
        op = cells["op"] if len(cells["op"]) <= op_w else "…" + cells["op"][-(op_w - 1):]
        return "  " + op.ljust(op_w) + "".join(" " * sep + cells[h].rjust(widths[h]) for h in head)

    return [fmt({"op": "op", **{h: h for h in head}}), *(fmt(r) for r in rows)]


def notes(report: dict[str, Any], sm: dict[str, Any]) -> list[str]:
    """What the table does not show, a line each: operators, policy local, the planner, the pool,
    stages, the costliest sites, why calls ran here."""
    lines = []
    operators = report.get("operators") or {}
    if operators and not operators.get("intercepted"):
        lines.append(f"  operators @, @=, .dot: not intercepted ({operators.get('why')}), not counted")
    if report["policy"] == "local" and report["ops"]:
        lines.append("  policy local: every call computed here, counted under <floor")
    pl = report.get("planner")
    if pl and (pl.get("explored_calls") or pl.get("model_resets")):
        lines.append(f"  planner: {pl['explored_calls']} calls explored ({ms(pl['explore_spent_s'])}), "
                     f"{pl.get('explorations_abandoned', 0)} abandoned, {pl['model_resets']} model resets")
    if report.get("pool"):
        from .pool import pool_lines  # D118: for a run with a pool alone

        lines += [x for line in pool_lines(report["pool"], report["events"]) for x in fitted(line, " " * 6)]
    if report.get("stages"):
        from .stages import stage_lines  # D118

        stages = stage_lines(report["stages"])
        if any(len(line) > WIDTH for line in stages):
            tail = " (their table: fusion-shim report --full)"
            stages = [listed("  stages: ", list(report["stages"]), WIDTH - len(tail)) + tail]
        lines += stages
    w = report.get("worker")
    if w is not None and w.get("cpu_start"):
        lines += fold(f"  embedded worker (no GPU on this host) {w['cpu_start']}")
    sites = sm.get("top_sites") or []
    if sites:
        lines.append("  top call sites: " + ("" if len(sites) <= TOP_SITES else MORE.format(n=len(sites) - TOP_SITES)))
        for s in sites[:TOP_SITES]:
            lines.append(clip(f"    {ms(s['wall_s']):>8} {n(s['calls']):>5} calls ({n(s['worker'])} on the worker) "
                              f"{s['op'].removeprefix('numpy.')} {_short_site(s['site'])}"))
    by_kind = sm.get("fallbacks_by_kind")  # D324: absent from a report older than the kinds
    if by_kind:
        lines.append(listed("  fallbacks by kind: ", [f"{kind} {n(k)}" for kind, k in by_kind.items()]))
    reasons = sorted(((k, name, r) for name, o in report["ops"].items() for r, k in o["reasons"].items()),
                     key=lambda x: -x[0])
    if reasons:
        more = len(reasons) - TOP_REASONS
        lines.append("  ran here, and why:" + (f" {MORE.format(n=more)}" if more > 0 else ""))
        for k, name, reason in reasons[:TOP_REASONS]:
            lines.append(clip(f"    {name.removeprefix('numpy.')} x{n(k)}: {reason}"))
    return lines


def _short_site(site: str) -> str:
    """file:line with its file's directory and name only (--full has the whole path)."""
    parts = site.split("/")
    return site if len(parts) <= 3 else "…/" + "/".join(parts[-2:])


def _kind(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", text)


def events(evs: list[dict], limit: int | None = EVENTS_OF_A_KIND, fit: bool = True) -> list[str]:
    """The events in order, at most ``limit`` of a kind (same text but for its numbers), the rest
    of a kind counted after its last shown; ``fit``: each line in WIDTH, long lists abbreviated."""
    kinds = [_kind(ev["what"]) for ev in evs]
    total = Counter(kinds)
    lines, shown = [], Counter()
    for ev, kind in zip(evs, kinds):
        shown[kind] += 1
        if limit is None or shown[kind] <= limit:
            line = f"  [{ev['t_s']:7.2f}s] {ev['what']}"
            lines += fitted(line, " " * 13) if fit else [line]
            if limit is not None and shown[kind] == limit and total[kind] > limit:
                lines.append(f"  {'':10} ... and {total[kind] - limit} more like it "
                             f"({'fusion-shim report --full' if fit else 'all in --report'})")
    return lines


def floor_lines(planner: dict[str, Any] | None) -> list[str]:
    """Every op's floor (``--full``): input bytes below which its calls stay on the fast path."""
    floors = (planner or {}).get("floors_bytes") or {}
    if not floors:
        return []
    raised = (planner or {}).get("floors_raised_bytes") or {}
    by_value: dict[int, list[str]] = {}
    for op, v in floors.items():
        by_value.setdefault(v, []).append(op.removeprefix("numpy.") + (" (raised)" if op in raised else ""))
    lines = ["  floors (input bytes below which an op's calls stay here; raised: by calls that could not win):"]
    for v, names in sorted(by_value.items()):
        value = "never" if v >= 1 << 62 else mb(v) if v >= 1e5 else f"{v}B"
        lines.append(f"    {value}: {', '.join(names)}")
    return lines


EXPLAIN = """\
What the report shows (fusion-shim report FILE; --full for the wide table, every event and floor).

Title: the process, the policy, the worker (its device and when it was ready), the run's wall time.

Summary (at most 6 lines):
  offloaded X of Y    calls sent to a worker, of every intercepted call; then the run against
                      running plainly (faster or slower) and the part that weighed most
  time                worker path: seconds in calls a worker answered (encode, send, transfer,
                      kernel, decode); here: seconds NumPy computed calls in this process;
                      waiting for a cold worker: calls held under policy remote until the worker
                      was ready; checks: the sampled checks' local recompute (kept out of the rest)
  moved               bytes through the socket (headers included), through shared memory (a
                      worker on this host), and inputs the worker already held (not moved)
  vs plain            what the shim added to the run's time against plain NumPy (negative: saved),
                      by part, the largest first: wait (for a cold worker), here (deciding and
                      preparing calls that then ran here), worker (the worker's calls over NumPy's
                      time for them), checks, start-up; ESTIMATED: the share priced from the
                      planner's prediction where no check measured NumPy's own time
  shim start-up       the shim's own start: at start (bootstrap, launcher, interception at NumPy's
                      import) and on first need (planner, worker links, call path)

Table, one row per op (each call in exactly one of the count columns; zero columns are left out):
  op        the NumPy function or operator (numpy. left out; a long name keeps its end)
  calls     every intercepted call of the op
  worker    computed on a worker
  here      computed here by decision: the planner priced it faster here, the op was pinned here
            (a checked answer differed, or the worker crashed on it), or its arguments are not
            offloaded (--full splits these into local and unsup)
  fallbk    meant for the worker, computed here because the worker failed it (a fault, a timeout,
            an answer the worker cannot reproduce exactly) or it was not ready under policy remote;
            --strict raises on each
  raised    NumPy raised the program's own error (a singular matrix: LinAlgError); raised to the
            program exactly as NumPy raises it; never a fallback
  <floor    kept here by the op's size floor at one comparison each: too small to gain on any worker
            (under policy local: every call)
  no-wkr    made while no worker was ready (policy auto, before the first ready): computed here at
            one comparison each, whatever their size
  checked   worker answers checked against NumPy (--verify); n/m!: m of them differed
  moved     bytes sent and received for the op, socket and shared memory
  time      the op's calls' seconds in all, on the worker path and here

Notes: explorations and model resets of the planner; the costliest call sites; the fallbacks by
kind (timeout, worker_lost, bad_reply, worker_fault, not_reproducible, busy, refused, out_of_memory,
no_worker_ready, unencodable, error_state, pinned, interrupted, internal_error: docs/faults.md); why
calls ran here (the commonest reasons, by op); events (three of a kind at most, the rest counted).
--full adds: time per phase (wait_ready, link_probe, fingerprint, encode, send, transfer, h2d,
kernel, d2h, decode, abandoned, local), each worker's speed against its self-benchmark, the
prediction error per family, every event, and each op's floor.
"""
