"""A link's state is one value that only its own methods change, its ready Event follows it, and no
other module assigns a link's attributes (D329)."""
from __future__ import annotations

import ast
import json
import pathlib
from types import SimpleNamespace

import pytest

import fusion_shim
from fusion_shim import transport
from fusion_shim.client.link import LinkState, WorkerLink
from fusion_shim.config import Config
from fusion_shim.ledger import Ledger

PACKAGE = pathlib.Path(fusion_shim.__file__).parent
QUEUE_COUNTERS: set = set()  # (module, attribute) pairs allowed to write a link's attribute: none


def _link_attributes() -> set[str]:
    """Every attribute a WorkerLink gives itself, and its properties."""
    tree = ast.parse((PACKAGE / "client" / "link.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WorkerLink")
    names = {n.name for n in ast.walk(cls) if isinstance(n, ast.FunctionDef)
             and any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list)}
    names |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return names


def _looks_like_link(expr: ast.expr, bound: set[str]) -> bool:
    """``link``, ``rt.link``, ``self._links[0]``, ``w_link``, or a name bound to one of those."""
    if isinstance(expr, ast.Subscript):
        expr = expr.value
    if isinstance(expr, ast.Name) and expr.id in bound:
        return True
    name = expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else ""
    return name.lstrip("_") in ("link", "links") or name.endswith("_link")


def _names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    return [n for elt in getattr(target, "elts", ()) for n in _names(elt)]


def foreign_writes(source: str, attributes: set[str]) -> list[tuple[int, str]]:
    """(line, attribute) of each assignment, augmented assignment, del or setattr of a link's attribute
    on a link that is not ``self``."""
    tree = ast.parse(source)
    bound: set[str] = set()  # names bound to a link: `first = self._links[0]`, `for link in links`
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and (_looks_like_link(node.value, bound) or (
                isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "WorkerLink")):
            bound.update(n for t in node.targets for n in _names(t))
        elif isinstance(node, (ast.For, ast.comprehension)) and _looks_like_link(node.iter, bound):
            bound.update(_names(node.target))
    found = []
    for node in ast.walk(tree):  # breadth first: sorted below
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("setattr", "delattr") and node.args
              and isinstance(node.args[-1 if node.func.id == "delattr" else 1], ast.Constant)):
            target, attr = node.args[0], node.args[1].value
        else:
            continue
        if attr in attributes and not (isinstance(target, ast.Name) and target.id == "self") \
                and _looks_like_link(target, bound):
            found.append((node.lineno, attr))
    return sorted(found)


def test_the_scan_finds_a_write_to_a_link_from_outside_and_not_the_links_own():
    attributes = _link_attributes()
    assert {"state", "url", "tmpdir", "ready", "stopped", "inflight"} <= attributes
    outside = ("def make(self):\n    first = self._links[0]\n    first.state = 'deferred'\n"
               "    self.link.url, self.link.tmpdir = 'u', 't'\n    setattr(link, 'proc', None)\n"
               "    for w in self.links:\n        w.restarts += 1\n    rec.bytes_sent = 0\n    model.link.rtt = 1\n")
    assert foreign_writes(outside, attributes) == [(3, "state"), (4, "tmpdir"), (4, "url"), (5, "proc"),
                                                   (7, "restarts")]
    own = "class WorkerLink:\n    def stop(self):\n        self.url = None\n        self._state = 'stopped'\n"
    assert foreign_writes(own, attributes) == []


def test_no_module_assigns_a_links_attributes():
    attributes = _link_attributes()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        found += [(where, line, attr) for line, attr in foreign_writes(path.read_text(), attributes)
                  if (where, attr) not in QUEUE_COUNTERS]
    assert found == [], "a link's attributes change only through its methods (D329): " + repr(found)


@pytest.fixture
def link():
    planner = SimpleNamespace(worker_down=lambda index: None)
    made = WorkerLink(Config(), Ledger(), planner, url="ipc:///nonexistent/fusion-shim-link-state.sock")
    yield made
    made.stop()


def _consistent(link: WorkerLink) -> bool:
    return link.ready.is_set() == (link.state is LinkState.READY)


def test_the_ready_event_is_set_exactly_while_the_state_is_ready(link):
    assert link.state == "starting" and not link.ready.is_set()
    for state in [s for s in LinkState if s is not LinkState.STOPPED]:
        for before in (LinkState.READY, LinkState.DOWN):  # each state entered from ready and from another
            link._become(before)
            assert link._become(state) and link.state is state and _consistent(link), (before, state)
    link._become(LinkState.READY)
    assert link._become(LinkState.STOPPED) and _consistent(link) and link.stopped
    link = WorkerLink(Config(), Ledger(), SimpleNamespace(), url="ipc:///nonexistent/fusion-shim-b.sock")
    link._ready("ready")
    assert link.state == "ready" and link.ready.is_set() and link.not_ready_why() is None
    link._probe_failed(transport.Timeout("no reply"))  # a failed probe leaves no stale readiness
    assert link.state == "down" and not link.ready.is_set() and _consistent(link)
    link.defer("ipc:///nonexistent/worker-0.sock", "/nonexistent")
    assert (link.state, link.url, link.tmpdir) == ("deferred", "ipc:///nonexistent/worker-0.sock", "/nonexistent")
    link.stop()


def test_a_stopped_link_stays_stopped_and_never_ready(link):
    link._ready("ready")
    link.stop()
    assert link.stopped and link.state == "stopped" and not link.ready.is_set()
    link._ready("back")
    link._become(LinkState.DOWN)
    link.defer()
    assert link.state is LinkState.STOPPED and not link.ready.is_set()


def test_the_state_is_read_only_from_outside_and_reads_as_its_string(link):
    with pytest.raises(AttributeError):
        link.state = "ready"
    with pytest.raises(AttributeError):
        link.stopped = True
    assert link.state == "starting" and f"{link.state}" == str(link.state) == "starting"
    assert json.dumps({"state": link.state}) == '{"state": "starting"}'
    assert link.plan_state(None).state == "starting"
