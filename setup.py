"""Only what pyproject.toml cannot say: install ``fusion_shim.pth`` at the top of site-packages, so
that ``FUSION_SHIM=1 python app.py`` works for any launch (see fusion_shim/_bootstrap.py)."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

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


setup(cmdclass={"build_py": BuildPyWithPth})
