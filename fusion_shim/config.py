"""One frozen Config for the whole shim.

Precedence: defaults < a ``[tool.fusion_shim]`` table in ``pyproject.toml`` < ``FUSION_SHIM_*``
environment variables < explicit arguments (command-line flags or keyword arguments to
:func:`Config.load`). The table's keys are the variables' names without the prefix, in lower case
(``ready_timeout``, or ``ready-timeout``); it is read from the nearest ``pyproject.toml`` holding one,
from the program's directory upward (:func:`find_project`), and only where a caller passes
``project``: launches read it, ``fusion_shim.install()`` does not. Every variable carries the one
``FUSION_SHIM_`` prefix; an unknown name or an invalid value, in either place, fails at start with a
message that names where it was set and lists what is valid.

``FUSION_SHIM`` itself (no suffix) only switches the ``.pth`` bootstrap on; it is not a field.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping

PREFIX = "FUSION_SHIM_"
TABLE = "tool.fusion_shim"
PATH_FIELDS = ("report", "trace", "server_key", "client_keys")  # relative to the pyproject that sets them
SCHEMES = ("inproc", "ipc", "tcp")  # the transports' URL schemes (fusion_shim.transport serves them)
POLICIES = ("auto", "local", "remote")
SHM_MODES = ("auto", "0")
DEVICES_HELP = "auto, cpu, cuda or cuda:N"


class ConfigError(ValueError):
    """A setting is unknown or has an invalid value; the message lists the valid ones."""


def _bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; valid: 1, 0, true, false, yes, no, on, off")


def _positive_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number; valid: a positive number of seconds") from None
    if not value > 0:
        raise ConfigError(f"{name}={raw!r} must be > 0")
    return value


def _nonneg_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number; valid: a number >= 0") from None
    if not value >= 0:
        raise ConfigError(f"{name}={raw!r} must be >= 0")
    return value


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ConfigError(f"{name}={raw!r} is invalid; valid: {', '.join(choices)}")
        return value
    return parse


def _fraction(name: str, raw: str) -> float:
    value = raw.strip().lower()
    if value == "all":
        return 1.0
    if value in ("none", "off", ""):
        return 0.0
    try:
        frac = float(value)
    except ValueError:
        frac = -1.0
    if not 0.0 <= frac <= 1.0:
        raise ConfigError(f"{name}={raw!r} is invalid; valid: a fraction between 0 and 1, all, none")
    return frac


def _device(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("auto", "cpu", "cuda"):
        return value
    if value.startswith("cuda:") and value[5:].isdigit():
        return value
    raise ConfigError(f"{name}={raw!r} is invalid; valid: {DEVICES_HELP}")


def _uid(name: str, raw: str) -> int | None:
    value = raw.strip()
    if not value:
        return None
    if not value.isdigit():
        raise ConfigError(f"{name}={raw!r} is invalid; valid: a numeric user id (`id -u USER`)")
    return int(value)


def _worker_url(name: str, raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"{name}={raw!r} has an unknown scheme; valid: {', '.join(s + '://' for s in SCHEMES)}")
    return value


def _worker_urls(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated worker URLs: each decision picks local or one of them."""
    urls = tuple(u for u in (_worker_url(name, part) for part in raw.split(",")) if u)
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{name}={raw!r} lists a worker twice; valid: distinct URLs separated by commas")
    return urls


def _stages(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated ``MODULE:QUALNAME`` functions to run as stages."""
    specs = tuple(p.strip() for p in raw.split(",") if p.strip())
    for spec in specs:
        module, colon, qualname = spec.partition(":")
        parts = [*module.split("."), *qualname.split(".")]
        if not colon or not all(p.isidentifier() for p in parts):
            raise ConfigError(f"{name}={raw!r}: {spec!r} is invalid; valid: MODULE:QUALNAME (app:step, "
                              "pkg.mod:Class.method, __main__:step), separated by commas")
    return tuple(dict.fromkeys(specs))


POOL_SCHEME = "ray://"
POOL_DEFAULT_NAME = "default"


def parse_pool(url: str) -> tuple[str, str]:
    """``ray://ADDRESS[/NAME]`` -> (Ray address, pool name); ``auto`` is the cluster this host is in."""
    if not url.startswith(POOL_SCHEME):
        raise ValueError(f"{url!r} is not a pool address; valid: ray://ADDRESS[/NAME], ray://auto")
    address, _, name = url[len(POOL_SCHEME):].partition("/")
    if not address:
        raise ValueError(f"{url!r} names no Ray address; valid: ray://HOST:PORT[/NAME], ray://auto")
    if name and not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"{url!r}: pool name {name!r} is invalid; valid: letters, digits, - and _")
    return address, name or POOL_DEFAULT_NAME


def _pool(name: str, raw: str) -> str | None:
    """``ray://ADDRESS[/NAME]``: a pool of workers on a Ray cluster (fusion_shim.pool)."""
    if not raw.strip():
        return None
    try:
        parse_pool(raw.strip())
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return raw.strip()


def _text(name: str, raw: str) -> str | None:
    return raw or None


def _server_key(name: str, raw: str) -> str | None:
    """A file holding the worker's CURVE public key (``server.key`` from ``fusion-shim keys``)."""
    if not raw.strip():
        return None
    from .auth import KeyFileError, load_public  # local import: zmq only when keys are used

    try:
        load_public(raw)
    except KeyFileError as exc:
        raise ConfigError(f"{name}: {exc}; valid: the server.key file written by `fusion-shim keys`") from None
    return raw


def _client_keys(name: str, raw: str) -> str | None:
    """This client's CURVE key pair (``NAME.key_secret``), private to its owner (mode 0600)."""
    if not raw.strip():
        return None
    from .auth import KeyFileError, load_pair

    try:
        load_pair(raw)
    except KeyFileError as exc:
        raise ConfigError(f"{name}: {exc}; valid: a NAME.key_secret file written by `fusion-shim keys`") from None
    return raw


# name -> default; a Config holds exactly these (D36: a plain class, no dataclass machinery at import)
DEFAULTS: dict[str, Any] = {
    "policy": "auto",         # auto | local | remote
    "worker": None,           # URL of a running worker; None: start an embedded one over ipc://
    "workers": (),            # several running workers (FUSION_SHIM_WORKERS=url,url); replaces worker
    "pool": None,             # ray://ADDRESS[/NAME]: a pool's workers, found through Ray; replaces both
    "device": "auto",         # device of the embedded worker
    "report": None,           # path for the JSON report
    "quiet": False,           # no summary table on stderr at exit
    "timeout": 60.0,          # seconds a remote call may take before it is computed locally
    "ready_timeout": 120.0,   # seconds policy=remote waits for a warming worker before running locally
    "min_flops": 0.0,         # auto: below this estimated work a call never leaves the process;
    #                           0: only the per-op floors the planner derives from its models
    "strict": False,          # turn every fallback and every mismatch into an error
    "verify": 0.0,            # fraction of worker answers also computed here and compared
    "trace": None,            # path for a Chrome-trace (Perfetto) timeline of the run
    "residency": True,        # keep inputs and results on the worker, send references
    "shm": "auto",            # auto: buffers through shared memory when the worker is on this host; 0: never
    "native": True,           # the C extension: `@`, `@=`, `.dot` trampolines and the C fast path
    #                           of wrapped functions; 0 turns both off (wrapt only)
    "server_key": None,       # path: the worker's CURVE public key (a worker run with --keys)
    "client_keys": None,      # path: this client's CURVE key pair; both or neither
    "worker_uid": None,       # an ipc:// worker may also run as this uid (besides this user and root)
    "insecure": False,        # no authentication where the other end offers none: a tcp worker run
    #                           --insecure is spoken to in plaintext (D181), a pool's Ray cluster without
    #                           token authentication is used (D210); both said loudly on stderr
    "stages": (),             # MODULE:QUALNAME functions run whole on a worker (docs/stages.md)
}


class Config:
    """The settings of one run, frozen: each field of :data:`DEFAULTS` as an attribute, compared and
    hashed by value; :meth:`replace` makes a changed copy."""

    __slots__ = tuple(DEFAULTS)
    policy: str
    worker: str | None
    workers: tuple[str, ...]
    pool: str | None
    device: str
    report: str | None
    quiet: bool
    timeout: float
    ready_timeout: float
    min_flops: float
    strict: bool
    verify: float
    trace: str | None
    residency: bool
    shm: str
    native: bool
    server_key: str | None
    client_keys: str | None
    worker_uid: int | None
    insecure: bool
    stages: tuple[str, ...]

    def __init__(self, **values: Any):
        unknown = set(values) - DEFAULTS.keys()
        if unknown:
            raise TypeError(f"Config has no field {sorted(unknown)[0]!r}; fields: {', '.join(DEFAULTS)}")
        setter = object.__setattr__
        for name, default in DEFAULTS.items():
            setter(self, name, values.get(name, default))

    @staticmethod
    def fields() -> tuple[str, ...]:
        """The field names, in order."""
        return tuple(DEFAULTS)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in DEFAULTS}

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Config is frozen: cannot assign {name!r} (use .replace)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Config is frozen: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in DEFAULTS)

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in DEFAULTS))

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in DEFAULTS) + ")"

    def __reduce__(self) -> tuple:
        return _config, (self.as_dict(),)

    def replace(self, **changes: Any) -> "Config":
        return Config(**{**self.as_dict(), **changes})

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, *, project: "Project | None" = None,
             **overrides: Any) -> "Config":
        """Defaults, then ``project``'s table, then ``FUSION_SHIM_*`` from ``env`` (``os.environ`` if
        None), then ``overrides``."""
        return cls.load_with_sources(env, project=project, **overrides)[0]

    @classmethod
    def load_with_sources(cls, env: Mapping[str, str] | None = None, *, project: "Project | None" = None,
                          **overrides: Any) -> "tuple[Config, dict[str, str]]":
        """:meth:`load`, and where each field not left at its default was set."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if project is not None:
            for field, value in project.values().items():
                values[field], sources[field] = value, f"{project.path} [{TABLE}]"
        for field, value in _from_env(env).items():
            values[field], sources[field] = value, f"environment {PREFIX}{field.upper()}"
        for field, value in _from_overrides(overrides).items():
            values[field], sources[field] = value, f"--{field.replace('_', '-')}"
        _check_pairs(values, sources)
        return cls(**values), sources

    def to_env(self, also: "tuple[str, ...] | Mapping[str, str]" = ()) -> dict[str, str]:
        """The environment that makes a child process load this same Config, whatever pyproject it
        finds: the fields away from their default, and those in ``also`` (set at their default over
        a pyproject's value)."""
        out = {}
        for name, default in DEFAULTS.items():
            value = getattr(self, name)
            if value is None or (value == default and name not in also):
                continue
            if isinstance(value, tuple):
                out[PREFIX + name.upper()] = ",".join(value)
                continue
            out[PREFIX + name.upper()] = str(int(value)) if isinstance(value, bool) else str(value)
        return out


def _config(values: dict[str, Any]) -> Config:
    return Config(**values)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, raw in env.items():
        if not key.startswith(PREFIX):
            continue
        field = key[len(PREFIX):].lower()
        if field not in _PARSERS:
            valid = ", ".join(PREFIX + f.upper() for f in _PARSERS)
            raise ConfigError(f"unknown setting {key}; valid: {valid}")
        values[field] = _PARSERS[field](key, raw)
    return values


def _from_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for field, value in overrides.items():
        if value is None:
            continue
        if field not in _PARSERS:
            raise ConfigError(f"unknown setting {field!r}; valid: {', '.join(_PARSERS)}")
        if isinstance(value, str) and field not in ("report", "trace"):
            value = _PARSERS[field](f"--{field.replace('_', '-')}", value)
        elif field in ("workers", "stages") and not isinstance(value, str):
            value = _PARSERS[field](field, ",".join(value))
        values[field] = value
    return values


def _check_pairs(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    if values.get("worker") and values.get("workers"):
        raise ConfigError(f"worker ({sources['worker']}) and workers ({sources['workers']}) are both set; "
                          "valid: one of them (workers takes a comma-separated list)")
    if values.get("pool") and (values.get("worker") or values.get("workers")):
        given = sources.get("worker") or sources.get("workers")
        raise ConfigError(f"pool ({sources['pool']}) and worker(s) ({given}) are both set; valid: one of them "
                          "(a pool's workers are found through Ray)")
    if bool(values.get("server_key")) != bool(values.get("client_keys")):
        raise ConfigError(f"{PREFIX}SERVER_KEY and {PREFIX}CLIENT_KEYS go together: a CURVE client needs the "
                          "worker's public key and its own key pair")


class Project:
    """The ``[tool.fusion_shim]`` table of one ``pyproject.toml``, checked by the variables' parsers."""

    def __init__(self, path: str, table: Mapping[str, Any]):
        self.path = path
        self.table = dict(table)

    def values(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, raw in self.table.items():
            field = key.replace("-", "_").lower()
            where = f"{self.path}: [{TABLE}] {key}"
            if field not in _PARSERS:
                raise ConfigError(f"{where}: unknown setting; valid: {', '.join(_PARSERS)}")
            value = _PARSERS[field](where, _toml_text(where, field, raw))
            if field in PATH_FIELDS and value and not os.path.isabs(value):
                value = os.path.join(os.path.dirname(self.path), value)
            out[field] = value
        return out


def _toml_text(where: str, field: str, raw: Any) -> str:
    """A TOML value as the text its variable would hold."""
    if isinstance(raw, bool):
        return "1" if raw else "0"
    if isinstance(raw, (int, float, str)):
        return str(raw)
    if field in ("workers", "stages") and isinstance(raw, list) and all(isinstance(u, str) for u in raw):
        return ",".join(raw)
    raise ConfigError(f"{where} = {raw!r}: not a string, number or boolean")


def find_project(start: str) -> Project | None:
    """The nearest ``pyproject.toml`` at or above ``start`` whose text has a ``[tool.fusion_shim]``
    table, as pytest and ruff search; None where there is none. A file without the table costs a
    read, not a TOML parse (D115)."""
    here = os.path.abspath(start)
    while True:
        path = os.path.join(here, "pyproject.toml")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if _may_hold_table(data):
            table = _parse(path, data).get("tool", {}).get("fusion_shim")
            if isinstance(table, dict):
                return Project(path, table)
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _may_hold_table(data: bytes) -> bool:
    """Whether TOML text could define ``tool.fusion_shim`` (a header, dotted keys, or a ``[tool]``
    table): D115, a parse costs tomllib's import, where this costs a scan."""
    return (b"tool.fusion_shim" in data or b'tool."fusion_shim"' in data
            or (b"[tool]" in data and b"fusion_shim" in data))


def _parse(path: str, data: bytes) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the tomli dependency, on Python 3.10 only
        import tomli as tomllib
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def program_dir(script: str | None = None) -> str:
    """Where the search for pyproject starts: the script's directory, else the working directory
    (``-m``, ``-c``, an interactive session)."""
    if script and os.path.isfile(script):
        return os.path.dirname(os.path.abspath(script))
    return os.getcwd()


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "policy": _choice(POLICIES),
    "worker": _worker_url,
    "workers": _worker_urls,
    "pool": _pool,
    "device": _device,
    "report": _text,
    "quiet": _bool,
    "timeout": _positive_float,
    "ready_timeout": _nonneg_float,
    "min_flops": _nonneg_float,
    "strict": _bool,
    "verify": _fraction,
    "trace": _text,
    "residency": _bool,
    "shm": _choice(SHM_MODES),
    "native": _bool,
    "server_key": _server_key,
    "client_keys": _client_keys,
    "worker_uid": _uid,
    "insecure": _bool,
    "stages": _stages,
}
