import os

import pytest

for _k in [k for k in os.environ if k.startswith("FUSION_SHIM")]:
    del os.environ[_k]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Benchmarks time one process at a time: ``-n`` (pytest-xdist) is off here."""
    if hasattr(config.option, "numprocesses"):
        config.option.numprocesses = 0
        config.option.dist = "no"
        config.option.tx = []


def pytest_terminal_summary(terminalreporter, config):
    """Added cost per call against each group's baseline (a test that set extra_info baseline=True),
    from the medians (and minima) of this same run."""
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups = {}
    for bench in session.benchmarks:
        if bench and "calls" in bench.extra_info:
            groups.setdefault(bench.group, []).append(bench)
    lines = []
    for group, benches in groups.items():
        base = [b for b in benches if b.extra_info.get("baseline")]
        if not base:
            continue
        base = base[0]
        for b in benches:
            if b is base:
                continue
            calls = b.extra_info["calls"]
            median = (b.stats.median - base.stats.median) / calls * 1e9
            best = (b.stats.min - base.stats.min) / calls * 1e9
            lines.append(f"  {group}: {b.name}: {median:+.0f} ns per call (median), {best:+.0f} ns (min)")
    if lines:
        terminalreporter.write_sep("-", "added per call, against the plain NumPy baseline of the same run")
        for line in lines:
            terminalreporter.write_line(line)
