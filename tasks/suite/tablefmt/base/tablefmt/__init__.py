"""tablefmt: plain-text and Markdown tables from Python data.

>>> from tablefmt import tabulate
>>> print(tabulate([["a", 1], ["b", 22]], headers=["name", "n"], style="pipe"))
| name |  n |
|:-----|---:|
| a    |  1 |
| b    | 22 |
"""

from .styles import STYLES, Style, get_style
from .table import Table, tabulate
from .width import display_width, strip_ansi

__version__ = "0.7.0"

__all__ = [
    "STYLES",
    "Style",
    "Table",
    "display_width",
    "get_style",
    "strip_ansi",
    "tabulate",
]
