"""semverkit: semantic versions and npm-style version ranges.

>>> from semverkit import Version, Range
>>> Version.parse("1.10.0") > Version.parse("1.9.3")
True
>>> Range("^1.2").max_satisfying(["1.1.0", "1.4.2", "2.0.0"])
Version('1.4.2')
"""

__version__ = "2.1.0"

from .spec import Comparator, InvalidRange, Range, satisfies  # noqa: E402
from .version import PARTS, InvalidVersion, Version, as_version  # noqa: E402

__all__ = [
    "PARTS",
    "Comparator",
    "InvalidRange",
    "InvalidVersion",
    "Range",
    "Version",
    "as_version",
    "satisfies",
]
