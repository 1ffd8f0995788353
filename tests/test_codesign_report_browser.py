"""The campaign report in a real browser: headless Chromium opens index.html from disk (no
network), runs its scripts, and the DOM then holds the answer and the drawn plotly figures.
Skips only when no Chromium binary is found; a Chromium that fails is a failure."""

import json
import re

import pytest

from cubic.codesign.report import find_chromium, render_in_chromium
from tests.test_codesign_report import toy_report


@pytest.mark.slow  # a campaign, a 5 MB page and two Chromium starts: ~15-30 s on a busy 2-core machine
def test_report_renders_in_headless_chromium_with_the_answer_and_the_figures(tmp_path):
    exe = find_chromium()
    if exe is None:
        pytest.skip("no Chromium binary on PATH (chromium, chromium-browser, google-chrome; or $CUBIC_CHROMIUM): "
                    "apt-get install chromium")
    rep = toy_report(tmp_path)
    figures = json.loads((rep / "summary.json").read_text())["figures"]
    dom = render_in_chromium(rep / "index.html", chromium=exe)

    answer = re.search(r'<section id="answer">(.*?)</section>', dom, re.S)
    assert answer is not None, "no answer section in the rendered page"
    assert "The winner is 2.00× faster than the baseline (95% CI" in answer.group(1)
    assert "peak memory (GiB" in answer.group(1) and "winner.yaml" in answer.group(1)
    # plotly drew every figure: its container and SVG exist only after plotly.js ran
    for f in figures:
        drawn = re.search(rf'<div id="fig-{f}"[^>]*class="[^"]*js-plotly-plot[^"]*"[^>]*>(.*?)class="plot-container',
                          dom, re.S)
        assert drawn is not None, f"figure {f} was not drawn"
    assert dom.count('class="plot-container') == len(figures) >= 4
    assert dom.count('class="main-svg"') >= 2 * len(figures)

    shot = tmp_path / "report.png"
    assert render_in_chromium(rep / "index.html", chromium=exe, screenshot=shot, size=(1200, 1600)) == ""
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000  # a page with figures, not a blank window
