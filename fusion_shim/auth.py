"""Authentication between clients and workers: ZeroMQ CURVE keys and the worker's allow-list.

A worker that binds anything but loopback or ``ipc://`` must authenticate its clients: a worker
reachable from the network runs kernels on whatever buffers arrive, so CURVE without a ZAP handler
(which authenticates no one) is not enough. ``fusion-shim keys DIR`` writes::

    DIR/server.key              the worker's public key: give it to clients (FUSION_SHIM_SERVER_KEY)
    DIR/server.key_secret       the worker's key pair: stays with the worker (mode 0600)
    DIR/authorized/NAME.key     the allow-list: public keys of the clients the worker accepts
    DIR/NAME.key_secret         a client's key pair: give it to that client only (FUSION_SHIM_CLIENT_KEYS)

Files use pyzmq's certificate format (``zmq.auth.load_certificate`` reads them), are created with
mode 0600 (never briefly wider) and the directory 0700. ``fusion-shim worker --keys DIR`` loads its
key pair and installs a ZAP authenticator (``zmq.auth.thread.ThreadAuthenticator``) that accepts
exactly the keys in ``DIR/authorized``: an unknown key, a client without CURVE, or a client holding
a wrong server key never completes the handshake, so none of its frames reach the worker's loop.
The allow-list is read when the worker starts; restart it after adding a client.

OpenSSH's rule for its own files holds for these (D62): the directory, its allow-list and every
key file must belong to the user who reads them (or to root) and be writable by no one else; a key
pair must also be unreadable by others. Anything else is refused with a message naming the path:
a directory another user created could carry that user's key in its allow-list.

A worker bound to loopback tcp without ``--keys`` serves with this user's own keys (D68):
``$XDG_CONFIG_HOME/fusion_shim/keys`` (``~/.config/fusion_shim/keys``), made on first use with one
client, ``local``; a client of the same user connecting to a loopback address finds them there.
"""
from __future__ import annotations

import datetime
import os
import stat
from typing import Any, Callable

SERVER = "server"
ALLOWED_DIR = "authorized"
LOCAL_CLIENT = "local"  # the same-host client in the user's own keys directory
CONNECTION_PROPERTY = "X-Conn"  # D319: the ZAP reply's per-handshake token, on each of its connection's messages


class KeyFileError(ValueError):
    """A key file or directory is missing, malformed, not the user's own, or open to others."""


def check_owned(path: str, unreadable: str = "cannot be read") -> os.stat_result:
    """``path``'s status, if it belongs to this user (or root) and no one else may write to it;
    else KeyFileError naming it (``unreadable``: what to call a path that cannot be read)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise KeyFileError(f"{path}: {unreadable} ({exc})") from None
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise KeyFileError(f"{path} belongs to uid {st.st_uid}, not to you (uid {me}): refused, since its "
                           "owner could change the keys in it")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                           f"chmod go-w {path}")
    return st


def _write_key_file(path: str, public: bytes, secret: bytes | None) -> None:
    kind = "Secret" if secret is not None else "Public"
    lines = [
        f"#   ****  Generated on {datetime.datetime.now().isoformat(timespec='seconds')} by fusion-shim keys  ****",
        f"#   ZeroMQ CURVE **{kind}** Certificate",
        "#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions." if secret else
        "#   Exchange securely, or use a secure mechanism to verify the contents of this file.",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public.decode("ascii")}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    # O_EXCL: never overwrite a key; 0o600 from the first byte, whatever the umask
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_keys(directory: str, clients: list[str]) -> dict[str, list[str]]:
    """Create the server key pair (unless present) and a key pair per client name, each client's
    public key in the allow-list. Returns the paths written, by kind."""
    import zmq

    for name in clients:
        if not name or os.sep in name or name.startswith(".") or name == SERVER:
            raise KeyFileError(f"client name {name!r} is invalid: a plain file name, not {SERVER!r}")
    for existing in (directory, os.path.join(directory, ALLOWED_DIR)):
        if os.path.lexists(existing):  # another user's directory is not made ours by a chmod
            _check_mine(existing)
    os.makedirs(os.path.join(directory, ALLOWED_DIR), mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    os.chmod(os.path.join(directory, ALLOWED_DIR), 0o700)
    written: dict[str, list[str]] = {"server": [], "clients": [], "authorized": []}
    secret_path = os.path.join(directory, SERVER + ".key_secret")
    if not os.path.exists(secret_path):
        public, secret = zmq.curve_keypair()
        _write_key_file(os.path.join(directory, SERVER + ".key"), public, None)
        _write_key_file(secret_path, public, secret)
        written["server"] += [os.path.join(directory, SERVER + ".key"), secret_path]
    for name in clients:
        path = os.path.join(directory, name + ".key_secret")
        allowed = os.path.join(directory, ALLOWED_DIR, name + ".key")
        if os.path.exists(path) or os.path.exists(allowed):
            raise KeyFileError(f"a key for client {name!r} exists already in {directory}; pick another name")
        public, secret = zmq.curve_keypair()
        _write_key_file(path, public, secret)
        _write_key_file(allowed, public, None)
        written["clients"].append(path)
        written["authorized"].append(allowed)
    return written


def _check_mine(path: str) -> None:
    """A directory the user will write keys into: it must be the user's own, whatever its mode
    (``make_keys`` then closes it to 0700)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        raise KeyFileError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}), or is a link: "
                           "refused, since its owner could add keys to it; pick another directory")


def load_public(path: str) -> bytes:
    """The public key in a certificate file (z85, 40 bytes)."""
    import zmq.auth

    check_owned(path, "not a CURVE key file")
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: not a CURVE key file ({exc})") from None
    if len(public) != 40:
        raise KeyFileError(f"{path}: the public key is not a 40-character z85 key")
    return public


def load_pair(path: str) -> tuple[bytes, bytes]:
    """The (public, secret) key pair in a ``.key_secret`` file, which must be private to its owner."""
    import zmq.auth

    mode = check_owned(path, "not a CURVE key file").st_mode
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path}: not a CURVE key file ({exc})") from None
    if secret is None:
        raise KeyFileError(f"{path} holds no secret key; give the .key_secret file")
    if len(public) != 40 or len(secret) != 40:
        raise KeyFileError(f"{path}: the keys are not 40-character z85 keys")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path} is readable by others (mode {stat.S_IMODE(mode):04o}); chmod 600 {path}")
    return public, secret


def user_keys_dir(env: dict | None = None) -> str:
    """This user's own keys directory, for workers and clients on one host (not created)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME")
    if not base or not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "fusion_shim", "keys")


def ensure_user_keys(env: dict | None = None) -> str:
    """The user's keys directory, with a server key pair and the ``local`` client made if missing."""
    directory = user_keys_dir(env)
    if not os.path.exists(os.path.join(directory, LOCAL_CLIENT + ".key_secret")):
        os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
        make_keys(directory, [LOCAL_CLIENT])
    return directory


def user_curve(env: dict | None = None) -> tuple[bytes, bytes, bytes] | None:
    """(server public, client public, client secret) from the user's keys directory; None when it
    has none yet. KeyFileError when it has them but they are not the user's own or are open to others."""
    directory = user_keys_dir(env)
    server, pair = os.path.join(directory, SERVER + ".key"), os.path.join(directory, LOCAL_CLIENT + ".key_secret")
    if not (os.path.exists(server) and os.path.exists(pair)):
        return None
    check_owned(directory)
    return (load_public(server), *load_pair(pair))


def secure_server(ctx: Any, sock: Any, keys_dir: str, token: Callable[[], int] | None = None) -> Any:
    """Make ``sock`` (not yet bound) a CURVE server accepting only the allow-listed clients; returns
    the running authenticator, to be stopped with the socket. Fails closed: no allow-list, no start.
    ``token``: called for each accepted handshake, its value sent as ``CONNECTION_PROPERTY`` (D319)."""
    check_owned(keys_dir)
    public, secret = load_pair(os.path.join(keys_dir, SERVER + ".key_secret"))
    allowed = os.path.join(keys_dir, ALLOWED_DIR)
    if os.path.isdir(allowed):
        check_owned(allowed)
    else:
        raise KeyFileError(f"{allowed} is missing: it holds the public keys of the clients to accept "
                        "(fusion-shim keys DIR --client NAME)")
    for name in os.listdir(allowed):
        if name.endswith(".key"):
            load_public(os.path.join(allowed, name))  # a malformed entry fails loudly, not silently
    auth = _authenticator(ctx, token)
    auth.start()
    auth.configure_curve(domain="*", location=allowed)
    return _curve_server(auth, sock, public, secret)


class AllowList:
    """An allow-list held in memory, for a worker whose clients' keys arrive at run time (a pool's:
    :mod:`fusion_shim.pool`). Empty, it accepts no one; ``allow`` adds a client's public key."""

    def __init__(self) -> None:
        self._keys: set[bytes] = set()

    def allow(self, public: bytes) -> None:
        if len(public) != 40:
            raise KeyFileError("a client key must be a 40-character z85 public key")
        self._keys = self._keys | {public}  # replaced whole: the ZAP thread reads it without a lock

    def __len__(self) -> int:
        return len(self._keys)

    def callback(self, domain: str, key: bytes) -> bool:  # pyzmq's credentials-provider protocol
        return key in self._keys


def secure_server_with(ctx: Any, sock: Any, public: bytes, secret: bytes, allowed: AllowList,
                       token: Callable[[], int] | None = None) -> Any:
    """As :func:`secure_server`, with the key pair and the allow-list held in memory."""
    auth = _authenticator(ctx, token)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=allowed)
    return _curve_server(auth, sock, public, secret)


def _authenticator(ctx: Any, token: Callable[[], int] | None) -> Any:
    """pyzmq's ZAP handler, whose accepting replies carry ``token()`` as ZAP metadata (D319), which
    libzmq delivers on every message of that connection."""
    from zmq.auth.thread import ThreadAuthenticator

    class Stamping(ThreadAuthenticator):
        def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                            user_id: Any = "anonymous") -> None:
            if status_code != b"200" or token is None:
                return super()._send_zap_reply(request_id, status_code, status_text, user_id)
            if isinstance(user_id, str):
                user_id = user_id.encode(self.encoding, "replace")
            name, value = CONNECTION_PROPERTY.encode(), str(token()).encode()
            metadata = bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value  # ZMTP property
            self.zap_socket.send_multipart([b"1.0", request_id, status_code, status_text, user_id, metadata])

    return Stamping(ctx)


def _curve_server(auth: Any, sock: Any, public: bytes, secret: bytes) -> Any:
    """``sock`` serves CURVE with this key pair, its clients checked by ``auth`` (already started)."""
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    return auth
