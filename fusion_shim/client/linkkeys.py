"""The keys a link authenticates its tcp worker with, why it has none (D68, D181), and what a link says
of its worker on stderr, once each per process."""
from __future__ import annotations

import sys
from typing import Any

from .. import transport
from ..config import Config


def _unauthenticated(config: Config, url: str) -> "transport.Unauthenticated":
    """D181: why this client holds no keys for the tcp worker at ``url``, and the fix."""
    from ..auth import KeyFileError, user_curve, user_keys_dir

    plain = "or --insecure here and on the worker to send plaintext"
    if not transport.is_loopback(url):
        return transport.Unauthenticated(
            f"no keys to authenticate {url}", "no keys given",
            "`fusion-shim keys DIR --client NAME` where the worker runs, serve it with --keys DIR, run this with "
            "--server-key DIR/server.key --client-keys DIR/NAME.key_secret (or FUSION_SHIM_SERVER_KEY and "
            f"FUSION_SHIM_CLIENT_KEYS) ({plain})")
    try:
        found = user_curve()
    except KeyFileError as exc:  # its message names the path and, where one does, the chmod that cures it
        return transport.Unauthenticated(f"this user's keys for {url} are refused", "keys refused",
                                         f"{exc} ({plain})")
    where = user_keys_dir()
    if found is not None:  # they appeared since: the next probe takes them
        return transport.Unauthenticated(f"no keys for {url} yet", "keys not yet read", "none needed: retried")
    return transport.Unauthenticated(
        f"no keys in {where} for {url}", f"no keys in {where}",
        f"start the worker without --keys (`fusion-shim worker --bind {url}` makes them there), or give "
        f"--server-key and --client-keys ({plain})")


def _loopback_tcp(url: str | None) -> bool:
    return bool(url) and url.startswith("tcp://") and transport.is_loopback(url)


def _load_curve(config: Config, url: str | None, event: Any) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) from the Config's key files, else, for a
    loopback tcp worker, from this user's own keys (D68); None: no CURVE. ``event``: where to say
    why none were found (None: quietly)."""
    from ..auth import KeyFileError, load_pair, load_public, user_curve, user_keys_dir

    if config.server_key:
        public, secret = load_pair(config.client_keys)
        return load_public(config.server_key), public, secret
    if not _loopback_tcp(url) or config.insecure:  # --insecure: plaintext, as asked
        return None
    try:
        curve = user_curve()
    except KeyFileError as exc:
        if event is not None:
            event(f"not using this user's keys for {url}: {exc}")
        return None
    if curve is None and event is not None:
        event(f"no keys in {user_keys_dir()} for {url} yet: nothing is sent there until they appear (D181: a "
              "worker started on this host without --keys makes them there)")
    return curve


_said: set = set()  # what was said on stderr, once each per process (an address, or a kind and address)


def _say_unreachable(url: str | None, exc: Exception) -> None:
    """D35: a wrong worker address is said on stderr at once (the table, if any, comes at exit)."""
    if url in _said:
        return
    _said.add(url)
    why = getattr(exc, "why", None) or str(exc)
    sys.stderr.write(f"fusion_shim: no worker at {url} ({why}); computing here\n")


def _say_unauthenticated(url: str | None, exc: "transport.Unauthenticated") -> None:
    """D181: why nothing goes to a tcp worker, and the fix, in one line on stderr."""
    if ("auth", url) in _said:
        return
    _said.add(("auth", url))
    sys.stderr.write(f"fusion_shim: nothing sent to {url} ({exc.why}); computing here: {exc.fix}\n")


def _say_insecure(url: str | None) -> None:
    if ("insecure", url) in _said:
        return
    _said.add(("insecure", url))
    sys.stderr.write(f"fusion_shim: WARNING: sending to {url} WITHOUT AUTHENTICATION (--insecure): anyone "
                     "listening at that address gets every input and chooses every answer\n")
