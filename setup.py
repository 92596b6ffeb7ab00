"""Only what pyproject.toml cannot say:

- install ``fusion_shim.pth`` at the top of site-packages, so that ``FUSION_SHIM=1 python app.py``
  works for any launch (see fusion_shim/_bootstrap.py);
- build the optional C extension ``fusion_shim._native`` from ``native/_native.c`` (the
  trampolines behind ``a @ b``, ``a @= b`` and ``a.dot(b)``). If it cannot be built (no compiler, no
  NumPy headers), the package still installs and works; the shim's report then says that the
  operators are not intercepted.
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
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
                   "The package works without it; `a @ b`, `a @= b` and `a.dot(b)` are then not intercepted.")
            print(msg, file=sys.stderr)


setup(
    cmdclass={"build_py": BuildPyWithPth, "build_ext": OptionalBuildExt},
    ext_modules=[
        Extension(
            "fusion_shim._native",
            sources=["native/_native.c"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
        )
    ],
)
