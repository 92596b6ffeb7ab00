"""Only what pyproject.toml cannot say:

- install ``fusion_shim.pth`` at the top of site-packages, so that ``FUSION_SHIM=1 python app.py``
  works for any launch (see ``fusion_shim._start``); an editable install (``pip install -e .``)
  gets it too, written into its wheel beside setuptools' own ``.pth``, or says at build that it
  could not;
- build the optional C extensions: ``fusion_shim._native`` from ``native/_native.c`` (the
  trampolines behind ``a @ b``, ``a @= b`` and ``a.dot(b)``), and on POSIX ``fusion_shim._segcopy``
  from ``native/_segcopy.c`` (the worker's SIGBUS-safe copy through a client's segment). If one
  cannot be built (no compiler, no NumPy headers), the package still installs and works; without
  the first the shim's report says that the operators are not intercepted, without the second the
  worker reads and writes segments through their fds.
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel
from setuptools.errors import CCompilerError, ExecError, PlatformError

PTH = "fusion_shim.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):  # used by editable installs (PEP 660)
        mapping = super().get_output_mapping()
        mapping[os.path.join(self.build_lib, PTH)] = PTH
        return mapping


class EditableWheelWithPth(editable_wheel):
    """The editable wheel holds only setuptools' finder and its ``.pth``: ours is added to it, so that
    ``FUSION_SHIM=1`` works from a checkout installed with ``pip install -e .``. Ours sorts after
    ``__editable__.*.pth``, so the finder that makes ``fusion_shim`` importable is in place first."""

    def _select_strategy(self, name, tag, build_lib):
        # setuptools' own hook since 64 (the EditableStrategy protocol): ours wraps whatever it picks
        return _WithPth(super()._select_strategy(name, tag, build_lib))


class _WithPth:
    def __init__(self, strategy):
        self.strategy = strategy

    def __call__(self, wheel, files, mapping):
        self.strategy(wheel, files, mapping)
        with open(PTH, "rb") as f:
            wheel.writestr(PTH, f.read())

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self.strategy.__exit__(*exc)


def _editable_cmdclass():
    """The editable command, or, where this setuptools has no strategy hook, a warning at build that
    ``FUSION_SHIM=1`` will do nothing with this install (the README says what to do instead)."""
    if hasattr(editable_wheel, "_select_strategy"):
        return {"editable_wheel": EditableWheelWithPth}
    print("WARNING: fusion_shim: this setuptools cannot add fusion_shim.pth to an editable install: "
          "FUSION_SHIM=1 will do nothing; use `python -m fusion_shim app.py`, or `pip install .`", file=sys.stderr)
    return {}


WITHOUT = {"fusion_shim._native": "`a @ b`, `a @= b` and `a.dot(b)` are then not intercepted",
           "fusion_shim._segcopy": "the worker then reads and writes shared-memory segments through their fds"}


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: the extension is an accelerator, not a requirement."""

    def run(self):
        self.skipped = set()
        try:
            import numpy
        except ImportError as exc:
            self._skip(self.extensions, f"NumPy is not importable at build time ({exc})")
            return
        for ext in self.extensions:
            ext.include_dirs.append(numpy.get_include())
        super().run()

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except (CCompilerError, ExecError, PlatformError, OSError) as exc:
            self._skip([ext], f"{type(exc).__name__}: {exc}")

    def copy_extensions_to_source(self):  # editable installs: only what was built
        built = [ext for ext in self.extensions if ext.name not in self.skipped]
        all_exts, self.extensions = self.extensions, built
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = all_exts

    def get_outputs(self):
        skipped = getattr(self, "skipped", set())
        return [path for ext, path in zip(self.extensions, super().get_outputs()) if ext.name not in skipped]

    def _skip(self, exts, why):
        for ext in exts:
            self.skipped.add(ext.name)
            msg = (f"WARNING: fusion_shim: the optional C extension {ext.name} was not built: {why.rstrip('.')}. "
                   f"The package works without it; {WITHOUT.get(ext.name, 'it is an accelerator')}.")
            print(msg, file=sys.stderr)


setup(
    cmdclass={"build_py": BuildPyWithPth, "build_ext": OptionalBuildExt, **_editable_cmdclass()},
    ext_modules=[
        Extension(
            "fusion_shim._native",
            sources=["native/_native.c"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
        ),
        *([Extension("fusion_shim._segcopy", sources=["native/_segcopy.c"])] if os.name == "posix" else []),
    ],
)
