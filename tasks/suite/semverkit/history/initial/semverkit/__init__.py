"""semverkit: semantic versions and npm-style version ranges."""

__version__ = "2.0.0"

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
