"""The base of the engines without a model (``scripted``, ``sleep``): what they share besides ``generate``."""
from __future__ import annotations

import threading
from typing import Any

from sao_harness.harness.engines.protocol import Engine


class StubEngine(Engine):
    """An ``Engine`` with no weights: ``update_weights`` only sets the policy version, ``health`` is always ok
    and counts ``calls``. Subclasses implement ``generate``, counting each call under ``_lock``."""

    def __init__(self, timeout_s: float = 600.0):
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._version = 0
        self.calls = 0

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, version: int, weights: dict[str, Any], timeout: float | None = None) -> None:
        self._version = version

    def health(self) -> dict[str, Any]:
        return {"ok": True, "kind": self.kind, "version": self._version, "calls": self.calls}
