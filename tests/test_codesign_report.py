"""The campaign's HTML report (cubic.codesign.report): one self-contained page, the answer first,
interactive plotly figures with each run's config on hover, nothing drawn that has nothing to show."""

import json
import re

import pytest

from cubic.codesign.campaign import Campaign
from cubic.codesign.report import write_report
from search.space import Space

SPACE = {"name": "toy", "objectives": [{"metric": "examples_per_s"}],
         "constraints": [{"metric": "ne", "max": 1.0}],
         "parameters": [{"name": "batch", "type": "categorical", "choices": [64, 128, 256, 512, 1024]},
                        {"name": "lr", "type": "float", "low": 0.001, "high": 0.1, "log": True}]}


def job(point):
    """Throughput grows with the batch; NE worsens past 256 (infeasible from 1024); 512 with a
    high learning rate runs out of memory; each run reports a 95% interval over its repeats."""
    b = point["batch"]
    if b == 512 and point["lr"] > 0.01:
        raise MemoryError("CUDA out of memory (toy)")
    v = 1000.0 * b + 3.0 * b * point["lr"]
    return {"examples_per_s": v, "examples_per_s_ci_lo": 0.97 * v, "examples_per_s_ci_hi": 1.03 * v,
            "repeats": 3.0, "ne": 0.8 + b / 5000, "peak_mem_bytes": 1e9 + b * 2e6}


def toy_report(tmp_path, evaluate=job, budget=10, name="toy"):
    """A small finished campaign with a measured baseline, and its report; the report's directory."""
    c = Campaign(Space.model_validate(SPACE), evaluate, name=name, strategy="random", budget=budget,
                 batch_size=budget, seed=3, storage=f"sqlite:///{tmp_path}/c.db")
    c.measure_baseline({"batch": 64, "lr": 0.01}, "today's job (batch 64)")
    c.run()
    write_report(name, storage=c.storage, out_dir=tmp_path / "rep")
    return tmp_path / "rep"


def test_the_page_is_self_contained_with_the_answer_first_and_interactive_figures(tmp_path):
    rep = toy_report(tmp_path)
    page = (rep / "index.html").read_text()
    # no network: no script, stylesheet or image fetched from anywhere
    assert not re.search(r"<(script|link|img|iframe)[^>]*(src|href)\s*=\s*['\"]?(https?:)?//", page, re.I)
    assert not re.search(r"<script[^>]*\bsrc=", page, re.I)  # every script is inline
    assert page.count("plotly.js v") >= 1 and len(page) > 1_000_000  # the bundle itself, once, inline
    figures = json.loads((rep / "summary.json").read_text())["figures"]
    assert {"best_so_far", "pareto", "runs", "importance"} <= set(figures)
    importance = json.loads((rep / "summary.json").read_text())["importance"]
    assert importance["runs"] >= 4 and importance["resamples"] > 0  # each share with its interval
    assert all(k["lo"] <= k["hi"] for k in importance["knobs"].values())
    for f in figures:
        assert f"id=\"fig-{f}\"" in page
    assert page.count("Plotly.newPlot(") == len(figures)
    assert not list(rep.glob("*.png"))  # the figures are the page's, not files beside it
    # the answer, at the top: winner against the baseline, NE, memory, the knobs, winner.yaml
    answer = page.index("<section id='answer'>")
    assert answer < page.index("<section id='figures'>") < page.index("<section id='campaign'>")
    section = page[answer:page.index("</section>", answer)]
    assert "faster than the baseline (95% CI" in section and "today&#x27;s job (batch 64)" in section
    assert "ne (lower is better)" in section and "peak memory (GiB" in section and "winner.yaml" in section
    # hover: a run's config, result, NE, memory, measured/served; failed runs say why
    hover = page.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")  # JSON in <script>
    assert "config: batch=" in hover and "NE: 0." in hover and "peak memory: 1." in hover
    assert "result: failed (error): MemoryError: CUDA out of memory" in hover
    assert "result: breaks a constraint" in hover and "<br>measured" in hover
    assert "<section id='failed'>" in page


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_numbers_are_rounded_for_people(tmp_path):
    page = (toy_report(tmp_path) / "index.html").read_text()
    tables = page[page.index("<section id='campaign'>"):]
    # every number in the tables: at most 3 significant digits (thousands separated), no long tails
    for cell in re.findall(r"<td>([^<]*)</td>", tables):
        for num in re.findall(r"\d[\d,]*\.\d+", cell):
            assert len(num.replace(",", "").replace(".", "").lstrip("0")) <= 3, (cell, num)


def test_a_figure_with_nothing_to_show_is_not_drawn_and_the_page_says_why(tmp_path):
    def broken(point):
        raise RuntimeError("no GPU here")

    rep = toy_report(tmp_path, evaluate=broken, budget=3, name="dead")
    page = (rep / "index.html").read_text()
    summary = json.loads((rep / "summary.json").read_text())
    assert summary["figures"] == ["runs"]  # the failed runs, by kind; nothing else has a point
    assert "Not drawn: best so far: no feasible run yet" in page and "Pareto front" in page
    assert "<section id='top-runs'>" not in page and "No run of 3 met" in page
    assert not (rep / "winner.yaml").exists() and not (rep / "winner.json").exists()


def test_a_run_a_pruner_stopped_is_counted_as_stopped_not_failed(tmp_path):
    from cubic.core.result import Result

    def stopping(point):  # the large batches are stopped early (as CommandRunner returns them)
        if point["batch"] >= 512:
            return Result.failed("pruned", "stopped early at step 2 by MedianPruner: examples_per_s 10",
                                 metrics={"examples_per_s": 10.0, "pruned_step": 2.0})
        return job(point)

    rep = toy_report(tmp_path, evaluate=stopping, budget=8, name="stops")
    page = (rep / "index.html").read_text()
    summary = json.loads((rep / "summary.json").read_text())
    stopped = summary["runs stopped early by the pruner"]
    assert stopped >= 1 and summary["failed runs"] == 0 and summary["runs"] == 8
    hover = page.replace("\\u003c", "<").replace("\\u003e", ">")
    assert "result: stopped early by the pruner: stopped early at step 2" in hover
    assert "Failed runs and runs stopped early" in page
