import json

import pytest

from cubic.cli.app import main
from fp8.placement import load_placement


def test_model_cli_prints_modelled_block_times(capsys):
    assert main(["fp8", "model", "--m", "8192", "--k", "8192", "--n", "8192", "--recipe", "rowwise",
                 "--norm-before", "--act-after", "sigmoid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == "modelled" and out["speedup"] == out["bf16_ms"] / out["fp8_ms"] > 1.0
    assert main(["fp8", "model", "--m", "256", "--k", "64", "--n", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] < 1.0  # small GEMMs: casts dominate


def test_a_modelled_speedup_says_how_far_the_model_held_on_timings_it_was_not_fitted_to(capsys, tmp_path):
    from cost_models.gpu_gemm import FIT_PATH, check_line, model_check

    assert main(["fp8", "model", "--m", "8192", "--k", "8192", "--n", "8192"]) == 0
    text = capsys.readouterr().out
    checked = json.loads(FIT_PATH.read_text())["checked"]  # written by experiments/h100_model_fit.py
    own = checked["own_measurement"]
    assert f"on {own['n']} fwd+bwd blocks measured on" in text and f"off by {own['mape_pct']:.0f}%" in text
    assert "not a measured speedup" in text and "never checked" not in text  # the check is of this device
    # a device measured on its own (the lent H200) is quoted with its own figures, one never measured says so
    h200 = checked["by_device"]["h200"]
    assert main(["fp8", "model", "--m", "8192", "--k", "8192", "--n", "8192", "--device", "h200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checked"] == checked and "never checked" not in out["trust"]
    said = f"on {h200['n']} fwd+bwd blocks measured on NVIDIA H200, speedups off by {h200['mape_pct']:.0f}%"
    assert said in out["trust"]
    assert main(["fp8", "model", "--m", "8192", "--k", "8192", "--n", "8192", "--device", "a100", "--json"]) == 0
    assert "a100 itself was never checked" in json.loads(capsys.readouterr().out)["trust"]
    bare = tmp_path / "fit.json"
    bare.write_text(json.dumps({"constants": {}}))  # constants without a recorded check: said, not hidden
    assert "not checked against a measurement" in check_line("h100", model_check(bare))
    # only another device's runs on record (no H100 run): its figures stand, the H100 is said never checked
    only = {**checked, "own_measurement": None, "devices": ["h200"]}
    assert said in check_line("h100", only) and "h100 itself was never checked" in check_line("h100", only)


def test_bad_input_exits_2(capsys, tmp_path):
    assert main(["fp8", "model", "--m", "-3", "--k", "1", "--n", "1"]) == 2
    assert main(["fp8", "probe", "--workload", "nope", "--budget-sqnr", "20"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"version": 1, "module_filter": ["x"]}))
    assert main(["fp8", "check", "--workload", "dlrm-small", "--placement", str(bad)]) == 2
    assert "module_filter" in capsys.readouterr().err


def test_probe_cli_writes_a_placement(tmp_path, capsys):
    from cubic.core.workloads import load_workload

    out = tmp_path / "fp8.json"
    assert main(["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--out", str(out),
                 "--warmup-steps", "2", "--max-batches", "3", "--no-require-fast"]) == 0
    p = load_placement(str(out))
    assert p.version == 1 and p.sites and p.budget_sqnr_db == 20
    for name, s in p.sites.items():
        assert s.error and s.speedups and s.dispatch["kernel"]
        assert (s.recipe is None) == (name not in p.module_filter)
        assert s.recipe is not None or s.reason
        # sites whose statistics call for Mods were probed again with them on (dlrm-small's heavy tails do)
        assert (s.mods_probe is not None) == (name in p.probe["mods_probed"])
        if s.mods_probe is not None and s.mods_probe.chosen:
            assert s.recipe is not None and s.applied_mods == s.mods_probe.mods
        if s.recipe is None:
            assert not s.applied_mods
    assert p.probe["mods_probed"] and p.probe["mods_probe_steps"] > 0
    printed = capsys.readouterr().out
    assert "FP8 sites:" in printed
    # under the placement, how its kind held when trained (fp8.checked: the packaged record)
    assert "quality: trained with FP8 against full precision (paired seeds" in printed
    from cubic.core.config import FP8Choice
    from fp8.quality import train_variant

    assert train_variant(load_workload("dlrm-small"), FP8Choice(policy="placement", placement=p.model_dump(mode="json")),
                         2)["finite"]


def toy_factory():
    """A model factory for `cubic fp8 probe --module` (used by the test below)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(0)

    def batch(step):
        x = torch.randn(64, 16, generator=g)
        return x, x[:, :4] * 2.0

    return model, batch


def test_probe_cli_takes_any_module(tmp_path):
    out = tmp_path / "m.json"
    assert main(["fp8", "probe", "--module", "tests.test_fp8_cli:toy_factory", "--budget-sqnr", "15",
                 "--out", str(out), "--max-batches", "4", "--no-require-fast"]) == 0
    p = load_placement(str(out))
    assert set(p.sites) == {"0", "2"} and p.workload == "tests.test_fp8_cli:toy_factory"
    # the held-out loss cost is measured per site (paired over the batches after the trained ones)
    e = p.sites["2"].error["rowwise"]
    assert e.ne_rel_ci_low <= e.ne_rel <= e.ne_rel_ci_high and p.budget_ne_rel == 0.0002
    assert main(["fp8", "probe", "--module", "no_such_mod:f", "--budget-sqnr", "15"]) == 2


def test_probe_cli_budget_ne_flag(tmp_path, capsys):
    base = ["fp8", "probe", "--module", "tests.test_fp8_cli:toy_factory", "--budget-sqnr", "15",
            "--max-batches", "3", "--no-require-fast", "--no-keep-first-last", "--out", str(tmp_path / "p.json")]
    assert main(base + ["--budget-ne", "off"]) == 0
    assert load_placement(str(tmp_path / "p.json")).budget_ne_rel is None
    assert main(base + ["--budget-ne", "0.5"]) == 0
    assert load_placement(str(tmp_path / "p.json")).budget_ne_rel == 0.005
    capsys.readouterr()
    (tmp_path / "p.json").unlink()
    for bad in ("abc", "0", "-1"):
        assert main(base + ["--budget-ne", bad]) == 2
        assert "--budget-ne" in capsys.readouterr().err and not (tmp_path / "p.json").exists()


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_budget_policy_probes_and_converts():
    from cubic.core.config import FP8Choice
    from cubic.core.models import build_model
    from cubic.core.workloads import load_workload
    from fp8.kernels import Fp8Linear
    from fp8.recommend import resolve_choice
    from fp8.runtime import apply_fp8

    from fp8.placement import parse_placement
    from fp8.recommend import DEFAULT_BUDGET_NE_REL

    w = load_workload("dlrm-small")
    choice = resolve_choice(FP8Choice(policy="budget", budget_sqnr_db=15.0), w)
    assert choice.policy == "placement"
    placement = parse_placement(choice.placement)
    model = apply_fp8(build_model(w), choice, w)
    converted = {n for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert converted == set(placement.module_filter)  # exactly the placement's FP8 sites
    # the short Probe's evidence is all in it: SQNR and held-out NE cost per site, the NE budget held
    assert placement.budget_ne_rel == DEFAULT_BUDGET_NE_REL and len(placement.sites) == 5
    assert all(s.error["rowwise"].ne_rel is not None and (s.recipe or s.reason) for s in placement.sites.values())
    # 15 dB alone (no NE budget) puts FP8 somewhere: what converts is the placement's choice
    assert any(s.error[r].ci_low_db >= 15.0 for s in placement.sites.values() for r in s.error if r != "bf16")


def l1_loss(output, target):
    """A user loss for `cubic fp8 probe --loss` (used by the test below)."""
    return (output - target).abs().mean()


def test_probe_module_takes_a_loss(capsys):
    import torch

    from fp8.recommend import resolve_loss

    assert resolve_loss("bce") is torch.nn.functional.binary_cross_entropy_with_logits
    user = resolve_loss("tests.test_fp8_cli:l1_loss")  # (pytest may import this file under another name)
    assert user.__name__ == "l1_loss" and float(user(torch.ones(2), torch.zeros(2))) == 1.0
    base = ["fp8", "probe", "--module", "tests.test_fp8_cli:toy_factory", "--budget-sqnr", "15", "--max-batches", "3",
            "--no-require-fast", "--json"]
    assert main(base + ["--loss", "tests.test_fp8_cli:l1_loss"]) == 0
    capsys.readouterr()
    for bad in ("hinge", "no_such_mod:f"):
        assert main(base + ["--loss", bad]) == 2
        assert "--loss" in capsys.readouterr().err


def test_probe_cli_recipes_torchao_gives_a_placement_torchao_runs(tmp_path, capsys):
    from cubic.core.recipes import TORCHAO_RECIPES

    base = ["fp8", "probe", "--module", "tests.test_fp8_cli:toy_factory", "--budget-sqnr", "10", "--max-batches", "3",
            "--no-require-fast", "--no-keep-first-last", "--budget-ne", "off"]
    other, ours = tmp_path / "other.json", tmp_path / "torchao.json"
    # restricted to the recipes torchao lacks, the sites land there, and the torchao export refuses them
    assert main(base + ["--recipes", "block128,mx32", "--out", str(other)]) == 0
    p = load_placement(str(other))
    assert p.module_filter and {s.recipe for s in p.fp8_sites().values()} <= {"block128", "mx32"}
    capsys.readouterr()
    assert main(["fp8", "export", str(other)]) == 2
    assert "--recipes torchao" in capsys.readouterr().err
    # --recipes torchao: the same sites, each in a recipe torchao runs; it exports
    assert main(base + ["--recipes", "torchao", "--out", str(ours)]) == 0
    q = load_placement(str(ours))
    assert q.module_filter == p.module_filter and q.probe["recipes"] == list(TORCHAO_RECIPES)
    assert {s.recipe for s in q.fp8_sites().values()} <= set(TORCHAO_RECIPES)
    assert all(s.dispatch["kernel"].removeprefix("emulated_") not in ("block128", "mx32") for s in q.sites.values())
    assert main(["fp8", "export", str(ours), "--out", str(tmp_path / "job.py")]) == 0
    capsys.readouterr()
    assert main(base + ["--recipes", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "--recipes" in err and "'fp16'" in err and len(err.strip().splitlines()) == 1


def test_a_workload_that_cannot_fit_and_an_unreachable_budget_are_refused_before_the_probe(capsys):
    # wukong-large's tables are ~450 GiB: a traceback from the allocator was what the user got
    for argv in (["fp8", "probe", "--workload", "wukong-large", "--budget-sqnr", "24"],
                 ["fp8", "check", "--workload", "wukong-large", "--all", "--steps", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--workload: the workload needs at least" in err
    # the placement's schema caps the budget; the probe's minutes came first
    assert main(["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "300"]) == 2
    assert "--budget-sqnr: at most 200 dB, got 300" in capsys.readouterr().err
    assert main(["fp8", "probe", "--module", "x:y", "--budget-sqnr", "20", "--device", "gpu"]) == 2
    assert "--device: not a device" in capsys.readouterr().err


def test_check_gives_a_paired_interval_over_seeds_and_says_one_seed_has_none(capsys):
    argv = ["fp8", "check", "--workload", "dlrm-small", "--all", "--steps", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "one seed, no interval" in out and "--seeds N (2 or more)" in out
    assert main(argv + ["--seeds", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    s = r["ne_rel_diff"]["all_tensorwise"]
    assert r["source"] == "measured" and r["seeds"] == [0, 1] and s["seeds"] == 2
    diffs = [run["all_tensorwise"]["ne_rel_diff"] for run in r["runs"]]
    assert s["mean"] == sum(diffs) / 2 and s["ci"][0] < s["mean"] < s["ci"][1]


def test_the_trust_line_says_when_a_recipe_mode_or_device_lies_outside_the_check(capsys):
    from cost_models.gpu_gemm import check_line, model_check
    from cost_models.hardware import load_device

    c = model_check()
    assert c["recipes"] and c["modes"] == ["compile"]  # written by experiments/h100_model_fit.py
    assert "outside the check" not in check_line("h100", c, recipes=tuple(c["recipes"]), mode="compile")
    line = check_line("h100", c, recipes=("block128",), mode="eager")
    assert "recipe block128 and mode eager outside the check" in line and "unchecked" in line
    a100 = check_line("a100", c, device=load_device("a100"))
    assert "a100 itself was never checked" in a100 and "no FP8 tensor cores" in a100
    assert main(["fp8", "model", "--m", "4096", "--k", "4096", "--n", "4096", "--recipe", "mx32"]) == 0
    assert "recipe mx32 outside the check" in capsys.readouterr().out
