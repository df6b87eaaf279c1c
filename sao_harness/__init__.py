"""sao-harness: train LLM coding agents on real repositories with SAO.

One namespace over the product's folders, through this folder's relative symbolic links (``core ->
../core``, ...; docs/architecture.md, section 1): ``sao_harness.core``, ``.envs``, ``.tasks``,
``.harness``, ``.trainer``, ``.eval`` and ``.sao`` (the ``sao`` command), in layers, each importing only
the ones below it.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sao-harness")
except PackageNotFoundError:  # a bare checkout, not installed
    __version__ = "0+checkout"
