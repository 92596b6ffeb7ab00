"""Importing this module bootstraps the shim as ``fusion_shim.pth`` does (for a ``sitecustomize``
or a hand-written ``.pth``): see ``fusion_shim._start``. The installed ``.pth`` calls that function
itself, which saves loading this module at every interpreter start (D111)."""
from . import _start

_start()
