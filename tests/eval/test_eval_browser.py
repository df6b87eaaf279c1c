"""The HTML report opens in a headless browser and shows its tables and plots (Debian's chromium,
installed once by ``tests.support.browser.ensure_chromium`` when missing)."""
from __future__ import annotations

import pytest

from tests.support import eval_data as units


@pytest.fixture(scope="module")
def chromium():
    from tests.support.browser import BrowserUnavailable, ensure_chromium

    try:
        return ensure_chromium()
    except BrowserUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.slow  # headless chromium
def test_html_report_renders_tables_and_plots(tmp_path, chromium):
    from sao_harness.tasks.formats.loaders import load_tasks
    from tests.support.browser import image_stats, screenshot

    tasks = {t.instance_id: t for t in load_tasks("bundled", instances=units.IDS)}
    d = tmp_path / "ev"
    units.synthetic_eval(d, tasks, {units.IDS[0]}, hack={units.IDS[1]})
    html = (d / "report.html").read_text()
    for iid in units.IDS:
        assert f"<td>{iid}</td>" in html  # the per-instance table
    assert "<td>sao-harness/semverkit</td>" in html and '<img alt="turns.png" src="data:image/png;base64,' in html

    png = screenshot(d / "report.html", tmp_path / "shot.png", size=(1200, 1600))
    variance, colours = image_stats(png)
    assert variance > 200, f"screenshot looks blank (pixel variance {variance:.1f})"
    assert colours > 100, f"screenshot has only {colours} colours"

    # the plots are drawn: the lower half (below the tables) holds the coloured bars, not just text
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(png).convert("RGB")).astype(int)
    lower = a[a.shape[0] // 3:]
    green = ((lower[..., 1] > lower[..., 0] + 40) & (lower[..., 1] > lower[..., 2] + 20)).sum()
    blue = (lower[..., 2] > lower[..., 0] + 60).sum()
    assert green > 500 and blue > 500, (green, blue)  # resolved bars (green) and token bars (blue)
