"""Headless Chromium for looking at reports: install it when missing, take a screenshot, judge it.

- ``ensure_chromium()`` returns the browser's path; when none is on PATH it installs Debian's
  ``chromium`` package once (``apt-get install -y chromium``, root only, through
  ``envs.hostpkg.ensure_programs``), else raises ``BrowserUnavailable`` saying how to install it.
- ``screenshot(html, png, size=(1200, 1600))`` renders a local file with
  ``chromium --headless --no-sandbox --disable-gpu ... --screenshot=PNG file://...`` in a fresh
  profile directory (removed afterwards) and returns the PNG path.
- ``image_stats(png) -> (variance, colours)``: pixel variance and number of distinct colours, to
  tell a rendered page from a blank one.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from sao_harness.envs.errors import EngineError
from sao_harness.envs.hostpkg import ensure_programs, which

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserUnavailable(RuntimeError):
    """No headless browser here and none could be installed."""


def find_chromium() -> str | None:
    for name in NAMES:
        path = which(name)
        if path:
            return path
    return None


def ensure_chromium(log=None) -> str:
    path = find_chromium()
    if path:
        return path
    try:
        ensure_programs({"chromium": "chromium"}, log=log)
    except EngineError as e:
        raise BrowserUnavailable(f"chromium is missing and could not be installed: {e}") from None
    path = find_chromium()
    if not path:
        raise BrowserUnavailable("chromium was installed but is not on PATH")
    return path


def screenshot(html_path: str | Path, png_path: str | Path, size: tuple[int, int] = (1200, 1600),
               timeout: float = 120.0) -> Path:
    """Screenshot of a local HTML file (see module doc); raises RuntimeError when chromium fails."""
    browser = ensure_chromium()
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    png_path.unlink(missing_ok=True)
    profile = tempfile.mkdtemp(prefix="sao-chromium-")
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={png_path}", f"--window-size={size[0]},{size[1]}",
           html_path.as_uri()]
    try:
        proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"chromium did not finish the screenshot within {timeout:g} s") from None
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    if not png_path.is_file():
        tail = "\n".join(proc.stdout.strip().splitlines()[-10:])
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}):\n{tail}")
    return png_path


def image_stats(png_path: str | Path) -> tuple[float, int]:
    """(pixel variance over all channels, number of distinct RGB colours) of a PNG."""
    with Image.open(png_path) as img:
        a = np.asarray(img.convert("RGB"))
    colours = len(np.unique(a.reshape(-1, 3), axis=0))
    return float(a.astype(np.float64).var()), colours
