"""The probe's table agrees with itself: each site safe / unsafe / inconclusive from the numbers
shown for its recipe; reasons quote those numbers; bad modules stop with one line (exit 2)."""

import json
import re

import pytest
import torch
from torch import nn

from cubic.cli.app import main
from cubic.core.stats import samples_to_resolve
from fp8.placement import decide_site, load_placement, verdict


def _err(sqnr, lo, hi, ne=None, sd_db=1.0, ne_sd=0.001, batches=8):
    e = {"sqnr_db": sqnr, "ci_low_db": lo, "ci_high_db": hi, "sd_db": sd_db, "batches": batches}
    if ne is not None:
        e |= {"ne_rel": ne[0], "ne_rel_ci_low": ne[1], "ne_rel_ci_high": ne[2], "ne_rel_sd": ne_sd,
              "ne_samples": 16, "ne_unit": "batches"}
    return e


def test_three_states_from_the_intervals():
    assert verdict(_err(30, 28, 32), 24.0, None)["verdict"] == "safe"
    assert verdict(_err(20, 18, 22), 24.0, None)["verdict"] == "unsafe"
    v = verdict(_err(24.5, 22, 27, sd_db=3.0), 24.0, None)
    assert v["verdict"] == "inconclusive"
    assert v["to_decide"] == {"sqnr": {"n": samples_to_resolve(3.0, 0.5), "unit": "Probe batches", "have": 8}}
    # the rows: NE intervals straddling the +0.02% budget are inconclusive, not safe / unsafe
    h2 = verdict(_err(30, 28, 32, ne=(0.00059, 0.00013, 0.00106)), 24.0, 0.0002)
    out = verdict(_err(30, 28, 32, ne=(-0.00013, -0.00056, 0.00029)), 24.0, 0.0002)
    assert h2["verdict"] == out["verdict"] == "inconclusive"
    assert h2["to_decide"]["ne"]["n"] == samples_to_resolve(0.001, 0.00039) and "sqnr" not in h2["to_decide"]
    both = verdict(_err(24.5, 22, 27, sd_db=3.0, ne=(0.00059, 0.00013, 0.00106)), 24.0, 0.0002)
    assert set(both["to_decide"]) == {"sqnr", "ne"}
    assert verdict(_err(30, 28, 32, ne=(0.003, 0.0025, 0.0035)), 24.0, 0.0002)["verdict"] == "unsafe"
    assert verdict(_err(30, 28, 32, ne=(0.0001, 0.00005, 0.00015)), 24.0, 0.0002)["verdict"] == "safe"


def test_the_reason_quotes_the_numbers_of_the_recipe_shown():
    site = {"errors": {"tensorwise": _err(21.0, 19.5, 22.5, ne=(0.0009, 0.0004, 0.0014)),
                       "rowwise": _err(27.3, 26.1, 28.4, ne=(0.00027, -0.00081, 0.00136))},
            "speedups": {"tensorwise": 1.2, "rowwise": 0.9}}
    d = decide_site(site, 24.0, require_fast=False, budget_ne_rel=0.0002)
    # rowwise straddles the NE budget (inconclusive) and tensorwise fails SQNR (unsafe): rowwise is shown
    assert d["recipe"] is None and d["verdict_recipe"] == "rowwise" and d["verdict"] == "inconclusive"
    assert not d["safe"]
    assert "+0.0270% [-0.0810%, +0.1360%]" in d["reason"] and "would decide it" in d["reason"]
    assert "-0.0167" not in d["reason"] and "tensorwise" not in d["reason"]
    # a placed site: safe, and its verdict recipe is the placed one
    d = decide_site(site, 19.0, require_fast=False, budget_ne_rel=None)
    assert d["recipe"] == d["verdict_recipe"] == "tensorwise" and d["verdict"] == "safe" and d["reason"] is None


def tower_factory():
    """A user's 4-layer tower (`cubic fp8 probe --module ... --loss bce`)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                          nn.Linear(32, 1))
    g = torch.Generator().manual_seed(1)

    def batch(step):
        x = torch.randn(128, 32, generator=g)
        return x, (x[:, :1] > 0).float()

    return model, batch


def test_the_cli_table_agrees_with_the_placement(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["fp8", "probe", "--module", "tests.test_fp8_verdicts:tower_factory", "--loss", "bce",
                 "--budget-sqnr", "20", "--max-batches", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    p = load_placement(str(out))
    assert "kernel (cpu-timed)" in text and "speedup (h100, modelled)" in text
    for name, s in p.sites.items():
        assert s.verdict in ("safe", "unsafe", "inconclusive") and s.verdict_recipe is not None
        assert s.safe == (s.verdict == "safe")
        e = s.error[s.verdict_recipe]
        if s.recipe is not None:
            assert s.recipe == s.verdict_recipe and s.verdict == "safe"
        row = next(line for line in text.splitlines() if line.split() and line.split()[0] == name)
        assert f"{e.sqnr_db:.1f} [{e.ci_low_db:.1f}, {e.ci_high_db:.1f}]" in row and s.verdict_recipe in row
        if s.verdict != "safe" and s.reason and not s.reason.startswith("keep_first_last"):
            assert f"({s.verdict_recipe})" in s.reason and f"{e.sqnr_db:.1f} [{e.ci_low_db:.1f}, {e.ci_high_db:.1f}]" in s.reason
        if s.verdict == "inconclusive":
            assert s.to_decide and all(d["n"] >= 2 for d in s.to_decide.values()) and "would decide it" in s.reason


def none_factory():
    return nn.Linear(4, 4), None


def raising_factory():
    raise RuntimeError("cannot build\nsecond line")


def zero_width_factory():
    import warnings

    with warnings.catch_warnings():  # torch warns once per process of zero-element init: alone, this test saw it
        warnings.simplefilter("ignore", UserWarning)
        model = nn.Sequential(nn.Linear(8, 0), nn.Linear(0, 1))
    return model, lambda step: (torch.randn(4, 8), torch.zeros(4, 1))


def nan_factory():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, lambda step: (torch.full((4, 8), float("nan")), torch.zeros(4, 1))


def late_nan_factory():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def batch(step):
        x = torch.randn(4, 8)
        if step >= 2:
            x[0, 0] = float("inf")
        return x, torch.zeros(4, 1)
    return model, batch


def nan_loss(output, target):
    return (output - target).pow(2).mean() * float("nan")


def bad_batch_factory():
    return nn.Sequential(nn.Linear(8, 1)), lambda step: torch.randn(4, 8)


@pytest.mark.parametrize("factory,loss,words", [
    ("none_factory", "mse", ["second value", "NoneType"]),
    ("raising_factory", "mse", ["raised RuntimeError: cannot build"]),
    ("zero_width_factory", "mse", ["'0'", "zero-width"]),
    ("nan_factory", "mse", ["non-finite input (NaN)", "site '0'", "step 0"]),
    ("late_nan_factory", "mse", ["non-finite input (inf)", "site '0'", "step 2"]),
    ("bad_batch_factory", "mse", ["batch_fn(0) must return (inputs, targets)"]),
    ("tower_factory", "tests.test_fp8_verdicts:nan_loss", ["full-precision loss is nan", "step 0"]),
])
def test_bad_modules_stop_with_one_line(factory, loss, words, tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = main(["fp8", "probe", "--module", f"tests.test_fp8_verdicts:{factory}", "--loss", loss,
               "--budget-sqnr", "20", "--max-batches", "4", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)


def mismatched_target_factory():
    return nn.Sequential(nn.Linear(8, 4)), lambda step: (torch.randn(4, 8), torch.zeros(4, 3))


def test_a_user_loss_that_warns_then_raises_is_still_one_line(tmp_path, capsys, recwarn):
    """mse_loss on mismatched shapes warns about broadcasting, then raises: the warning printed
    before the one error line (stop 58's probe); now kept back when the call fails."""
    rc = main(["fp8", "probe", "--module", "tests.test_fp8_verdicts:mismatched_target_factory",
               "--budget-sqnr", "20", "--max-batches", "4", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "the loss on batch 0 raised" in err
    assert not [w for w in recwarn if "target size" in str(w.message)]
