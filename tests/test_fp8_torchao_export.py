"""`cubic fp8 export --format torchao`: the exported module applied by torchao on this CPU converts
exactly the placement's sites with the placement's recipes (Mods applied), and a training step runs."""

import copy
import importlib.util
import json
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("torchao.float8")

from cubic.core.spec import SpecError  # noqa: E402
from fp8.placement import parse_placement  # noqa: E402
from fp8.torchao_export import (apply_placement_torchao, export_module, module_filter_fn, placement_filters,  # noqa: E402
                                torchao_plan)

warnings.filterwarnings("ignore", message=".*Enum subclass.*")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(),
                         nn.Linear(48, 1))


def _same_numerics(a: torch.Tensor, b: torch.Tensor) -> None:
    """The same outputs, up to the order of the last site's sums: site 6 is tensorwise, which cubic runs
    through _scaled_mm's rowwise path on a CPU (torchao: the tensorwise one); some CPUs round those 1 ulp
    apart. Every earlier site runs torchao's own path, so nothing upstream differs."""
    from fp8.torchao_parity import summation_bound

    assert a.dtype == b.dtype and bool(((a - b).abs() <= summation_bound(a, 128)).all())


def _site(k, n, recipe=None, kernel=None, mods=(), reason=None):
    return {"m": 128, "k": k, "n": n, "recipe": recipe, "kernel": kernel, "safe": recipe is not None,
            "applied_mods": list(mods), "reason": reason}


def _placement(**over):
    sites = {
        "0": _site(32, 64, reason="first (input) layer stays in high precision"),
        "2": _site(64, 64, "rowwise", "scaled_mm_rowwise", mods=[{"name": "clamp_outliers", "params": {"alpha": 8.0}}]),
        "4": _site(64, 48, "rowwise_with_gw_hp", "scaled_mm_rowwise_with_gw_hp"),
        "6": _site(48, 1, "tensorwise", "scaled_mm_tensorwise"),
    }
    sites.update(over)
    doc = {"workload": "toy", "sites": sites, "module_filter": sorted(n for n, s in sites.items() if s["recipe"])}
    return parse_placement(doc)


def _import(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _converted(model):
    return {n: m.config for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}


def test_exported_module_converts_exactly_the_sites_and_trains(tmp_path):
    from torchao.float8 import Float8LinearConfig

    p = _placement()
    assert torchao_plan(p)["recipes"] == {"rowwise": ["2"], "rowwise_with_gw_hp": ["4"], "tensorwise": ["6"]}
    path = tmp_path / "fp8_placement.py"
    path.write_text(export_module(p))
    job = _import(path)
    model = job.apply(_model())
    # the Mod wraps site 2, so torchao converts its inner linear; each with its recipe's config
    conv = _converted(model)
    assert set(conv) == {"2.linear", "4", "6"}
    for name, recipe in (("2.linear", "rowwise"), ("4", "rowwise_with_gw_hp"), ("6", "tensorwise")):
        assert conv[name] == Float8LinearConfig.from_recipe_name(recipe), name
    assert type(model[2]).__name__ == "ClampedLinear" and type(model[0]) is nn.Linear
    # a training step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(128, 32, generator=g), torch.randint(0, 2, (128, 1), generator=g).float()
    before = {n: q.detach().clone() for n, q in model.named_parameters() if n.endswith("weight")}
    for _ in range(2):
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    now = dict(model.named_parameters())
    assert [n for n, w in before.items() if torch.equal(w, now[n].detach())] == []  # every weight trained


def test_torchao_and_cubics_runtime_compute_the_same_forward():
    # the same placement through torchao and through cubic's runtime (fp8.runtime): same outputs
    from fp8.runtime import apply_placement

    p = _placement(**{"2": _site(64, 64, "rowwise", "scaled_mm_rowwise")})
    a, b = _model(), _model()
    apply_placement_torchao(a, p)
    apply_placement(b, p)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _same_numerics(a(x), b(x))


def test_bad_placements_are_refused_with_the_site_named(tmp_path):
    with pytest.raises(SpecError, match=r"sites\.4\.recipe"):
        torchao_plan(_placement(**{"4": _site(64, 48, "block128", "emulated_block128")}))
    with pytest.raises(ValueError, match="'4'.*in=64, out=48.*in=64, out=32"):
        m = _model()
        m[4] = nn.Linear(64, 32)
        apply_placement_torchao(m, _placement())
    with pytest.raises(ValueError, match="no nn.Linear of this name$"):
        apply_placement_torchao(nn.Sequential(nn.Linear(32, 64)), _placement())
    wrapped = nn.Module()
    wrapped.net = _model()  # the job's module around the model the placement was probed on
    with pytest.raises(ValueError, match="site '2': the model has no nn.Linear of this name, but has 'net.2': apply"):
        apply_placement_torchao(wrapped, _placement())



def test_a_jobs_own_torchao_calls_convert_exactly_the_sites_through_the_filter():
    """README's loop for a job with its own torchao calls: one module_filter_fn per recipe, each
    with its config, converts exactly the placement's sites in their recipes, as the export does."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    p = _placement(**{"2": _site(64, 64, "rowwise", "scaled_mm_rowwise")})
    assert p.recipes() == ["rowwise", "rowwise_with_gw_hp", "tensorwise"]
    model = _model()
    for recipe in p.recipes():
        f = module_filter_fn(p, recipe, model=model)
        assert f.recipe == recipe and f.config() == Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=f.config(), module_filter_fn=f)
    assert _converted(model) == {n: Float8LinearConfig.from_recipe_name(r) for n, r in
                                 (("2", "rowwise"), ("4", "rowwise_with_gw_hp"), ("6", "tensorwise"))}
    one = _placement(**{"2": _site(64, 64, "rowwise", "scaled_mm_rowwise"), "4": _site(64, 48, "rowwise", "scaled_mm_rowwise"),
                        "6": _site(48, 1, reason="kept")})
    f = module_filter_fn(one, model=_model())  # one recipe: it may be omitted
    assert f.recipe == "rowwise" and f.sites == {"2", "4"}
    none = parse_placement({"sites": {"0": _site(32, 64, reason="kept")}, "module_filter": []})
    assert module_filter_fn(none, model=_model()).sites == frozenset()


def test_placement_filters_reads_the_file_and_names_it(tmp_path):
    """README's two lines: the filters of a placement file, one per recipe; an error names the file."""
    from torchao.float8 import convert_to_float8_training

    p = _placement(**{"2": _site(64, 64, "rowwise", "scaled_mm_rowwise")})
    path = tmp_path / "fp8.json"
    path.write_text(p.model_dump_json())
    model = _model()
    for f in placement_filters(path, model=model):
        convert_to_float8_training(model, config=f.config(), module_filter_fn=f)
    assert _converted(model) == _converted(apply_placement_torchao(_model(), p))
    assert [f.recipe for f in placement_filters(p, model=_model())] == p.recipes()
    with pytest.raises(SpecError, match=rf"^{path}: sites.6: shape mismatch"):
        placement_filters(path, model=nn.Sequential(*list(_model())[:6], nn.Linear(48, 2)))


def test_the_filter_refuses_what_a_name_filter_would_do_silently():
    """Each of these converted the wrong modules, or none, without a word through a bare name filter
    (before stop 61: a model wrapped in another module converted nothing; one call with another
    recipe's config converted every site in it; a site's Mods were skipped; block128 ran as the
    config given)."""
    p = _placement(**{"2": _site(64, 64, "rowwise", "scaled_mm_rowwise")})
    wrapped = nn.Module()
    wrapped.net = _model()
    cases = {
        r"sites: the FP8 sites are in 3 recipes \(rowwise: 1, rowwise_with_gw_hp: 1, tensorwise: 1\)":
            lambda: module_filter_fn(p, model=_model()),
        r"sites: no FP8 site is in recipe 'mx32'": lambda: module_filter_fn(p, "mx32", model=_model()),
        r"sites.2: the model has no linear site of this name, but has 'net.2': a placement probed on a sub-module":
            lambda: module_filter_fn(p, "rowwise", model=wrapped),
        r"sites.6: shape mismatch: placement says k=48, n=1; model has 48, 2":
            # refused at the first recipe's call (site 6 is tensorwise): nothing converted yet
            lambda: module_filter_fn(p, "rowwise", model=nn.Sequential(*list(_model())[:6], nn.Linear(48, 2))),
        r"sites.2.applied_mods: site '2' carries Mods \(clamp_outliers\)":
            lambda: module_filter_fn(_placement(), "rowwise", model=_model()),
        r"sites.4.recipe: recipe 'block128' is not a torchao": lambda: module_filter_fn(
            _placement(**{"4": _site(64, 48, "block128", "emulated_block128")}), "rowwise", model=_model()),
    }
    for msg, call in cases.items():
        with pytest.raises(SpecError, match=r"^placement: " + msg) as e:
            call()
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="model"):  # without the model nothing could be checked
        module_filter_fn(p, "rowwise")


def test_cli_export_writes_the_module_and_refuses_bad_input(tmp_path):
    doc = tmp_path / "placement.json"
    doc.write_text(_placement().model_dump_json())
    out = tmp_path / "job_fp8.py"
    cli = [sys.executable, "-m", "cubic.cli.app", "fp8", "export"]
    r = subprocess.run([*cli, str(doc), "--format", "torchao", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "import job_fp8; model = job_fp8.apply(model)" in r.stdout
    assert set(_converted(_import(out).apply(_model()))) == {"2.linear", "4", "6"}
    bad = json.loads(doc.read_text())
    bad["sites"]["4"].update(recipe="mx32", kernel="emulated_mx32")
    doc.write_text(json.dumps(bad))
    r = subprocess.run([*cli, str(doc), "--format", "torchao"], capture_output=True, text=True)
    assert r.returncode == 2 and "sites.4.recipe" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


SPLIT = {"name": "split_outliers", "params": {"ratio": 16.0, "max_frac": 0.125}}
OUTLIERS = [3, 17]


def _heavy_x(seed: int, scale: float = 1000.0) -> torch.Tensor:
    x = torch.randn(128, 32, generator=torch.Generator().manual_seed(seed))
    x[:, OUTLIERS] *= scale  # two input channels dwarf the rest (wukong's heavy-tailed dense slots)
    return x


def _split_placement(split: bool = True):
    return _placement(**{"0": _site(32, 64, "rowwise", "scaled_mm_rowwise", mods=[SPLIT] if split else [])})


def test_split_outliers_site_exports_converts_its_inner_linear_and_trains(tmp_path):
    from torchao.float8 import Float8LinearConfig

    from fp8.runtime import apply_placement

    path = tmp_path / "fp8_split.py"
    text = export_module(_split_placement())
    assert "split_outliers at 0" in text
    path.write_text(text)
    model = _import(path).apply(_model())
    conv = _converted(model)
    assert set(conv) == {"0.linear", "2.linear", "4", "6"}
    assert conv["0.linear"] == Float8LinearConfig.from_recipe_name("rowwise")
    assert type(model[0]).__name__ == "OutlierSplitLinear"
    seen = {}
    model[0].linear.register_forward_hook(lambda m, i, o: seen.update(x=i[0].detach()))
    x = _heavy_x(1)
    with torch.no_grad():
        y = model(x)
    # the outlier channels were split off on this first batch: torchao's FP8 GEMM sees them zeroed
    assert model[0].outlier.nonzero().flatten().tolist() == OUTLIERS
    assert torch.equal(seen["x"][:, OUTLIERS], torch.zeros(128, 2)) and seen["x"][:, 0].abs().sum() > 0
    # the same placement through cubic's runtime computes the same thing
    ours = apply_placement(_model(), _split_placement())
    with torch.no_grad():
        _same_numerics(ours(x), y)
    # a training step: the outlier channels' weight columns train through the high-precision path
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model[0].linear.weight.detach().clone()
    loss = nn.functional.binary_cross_entropy_with_logits(model(x), torch.ones(128, 1))
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and not torch.equal(model[0].linear.weight[:, OUTLIERS], w0[:, OUTLIERS])
    # resumed from its own checkpoint: the same channels, not re-picked on a batch without outliers
    again = _import(path).apply(_model())
    again.load_state_dict(model.state_dict())
    with torch.no_grad():
        again(_heavy_x(2, scale=1.0))
    assert again[0].outlier.nonzero().flatten().tolist() == OUTLIERS


def test_split_outliers_is_what_makes_the_site_accurate_under_torchao():
    # measured here: the site's output error vs fp32, torchao with and without the split (rowwise)
    from fp8.recipes import sqnr_db

    x = _heavy_x(3)
    ref = _model()[0](x).detach()
    got = {}
    for split in (True, False):
        m = _model()
        apply_placement_torchao(m, _split_placement(split))
        with torch.no_grad():
            got[split] = sqnr_db(ref, m[0](x))
    assert got[True] > got[False] + 10.0, got


@pytest.mark.slow  # over 7 s: the slow suite (.ci/run runs it after make test)
def test_the_export_names_split_sites_and_refuses_what_torchao_cannot_run(tmp_path):
    doc = tmp_path / "placement.json"
    doc.write_text(_split_placement().model_dump_json())
    cli = [sys.executable, "-m", "cubic.cli.app", "fp8", "export"]
    r = subprocess.run([*cli, str(doc), "--out", str(tmp_path / "job_fp8.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "split_outliers at 0" in r.stdout
    bad = json.loads(doc.read_text())
    bad["sites"]["2"].update(recipe="block128", kernel="emulated_block128")
    doc.write_text(json.dumps(bad))
    r = subprocess.run([*cli, str(doc)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert "sites.2.recipe" in line and "'block128'" in line and "--recipes torchao" in line


def test_the_rescued_wukong_site_trains_the_same_under_torchao_as_under_cubic():
    # wukong-small's heavy-tailed dense slot with the Mods the rescue applies (pad_dims, split_outliers),
    # rowwise: torchao's export and cubic's runtime train the real workload to the same losses, bit for bit
    from cubic.core.config import Config
    from cubic.core.train import TrainSession
    from cubic.core.workloads import load_workload
    from fp8.runtime import apply_placement

    w = load_workload("wukong-small")
    site = "dense.layers.0.lcb.proj"
    lin = dict(TrainSession(w, Config(seed=0)).model.named_modules())[site]
    mods = [{"name": "pad_dims", "params": {}}, SPLIT]
    p = parse_placement({"workload": w.name, "module_filter": [site], "sites": {site: {
        "m": 256, "k": lin.in_features, "n": lin.out_features, "recipe": "rowwise", "kernel": "scaled_mm_rowwise",
        "applied_mods": mods, "safe": True}}})
    losses = {}
    for how, fn in (("torchao", apply_placement_torchao), ("cubic", apply_placement)):
        tr = TrainSession(w, Config(seed=0), transform=lambda m, fn=fn: fn(m, p) or m)
        losses[how] = tr.train(4)
        inner = dict(tr.model.named_modules())
        assert type(inner[f"{site}.linear.linear"]).__name__ == {"torchao": "Float8Linear", "cubic": "Fp8Linear"}[how]
        assert inner[f"{site}.linear"].outlier.any()  # the split found outlier channels on the real data
    assert losses["torchao"] == losses["cubic"] and all(map(torch.isfinite, torch.tensor(losses["torchao"])))
