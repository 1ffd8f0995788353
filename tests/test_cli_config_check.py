"""Config values are checked against what exists when the config is loaded (issue 22, point 7):
planners (sharding.types.PLANNERS, which sharding.registry builds), FP8 recipes
(cubic.core.recipes), the embedding kernel, optimizers, and the plan and placement documents a
config holds (their compute kernels, recipes and FP8 kernels). A bad value is one line on stderr
naming the file and the field, exit 2, nothing run, nothing recorded; a valid sharded config on
one process names the flag that fixes it (--world-size)."""

import json

import pytest

from cubic.cli import app as cli
from cubic.cli import common as cli_common
from cubic.core.config import Config, ShardingChoice
from cubic.core.result import Result
from cubic.core.spec import SpecError
from cubic.core.store import TrialStore
from cubic.core.workloads import load_workload
from cubic.runners.base import check_config_values, validate_config

BAD = (  # (config body, the field the message names)
    ("sharding: {planner: foo}\n", "sharding.planner"),
    ("fp8: {policy: all, recipe: foo}\n", "fp8.recipe"),
    ("kernels: {embedding: foo}\n", "kernels.embedding"),
    ("kernels: {dense_dtype: fp7}\n", "kernels.dense_dtype"),
    ("optimizers: {embedding: foo}\n", "optimizers.embedding"),
    ("fp8: {policy: placement}\n", "fp8.placement"),
    ("fp8: {policy: placement, placement: {sites: {a: {m: 1, k: 1, n: 1, recipe: foo, kernel: x}},"
     " module_filter: [a]}}\n", "fp8.placement.sites.a.recipe"),
    ("fp8: {policy: placement, placement: {sites: {a: {m: 1, k: 1, n: 1, recipe: tensorwise, kernel: foo}},"
     " module_filter: [a]}}\n", "fp8.placement.sites.a"),
    # values a run cannot use are refused, not recorded as a failed run or ignored (stop 57's probe)
    ("fp8: {policy: budget}\n", "fp8.budget_sqnr_db"),
    ("fp8: {budget_sqnr_db: 30}\n", "fp8.budget_sqnr_db"),
    ("fp8: {policy: all, placement: {}}\n", "fp8.placement"),
    ("sharding: {sync: gradients, sync_interval: 3}\n", "sharding.sync_interval"),
    # a model knob the workload refuses: the config's field, not the workload's dense_arch path
    ("model: {bottom_mlp: [0]}\n", "model.bottom_mlp.0"),
    ("model: {num_layers: 2}\n", "model.num_layers"),
)


pytestmark = pytest.mark.usefixtures("isolated")  # tests/conftest.py: a fresh directory and store


class Counting:
    """A runner that counts its runs (none may happen for a bad config)."""

    source = "measured"
    calls = 0

    def fingerprint_hash(self):
        return "fake-fp"

    def run(self, workload, config, *, steps=50, warmup=5, progress=None):
        self.calls += 1
        return Result(status="ok", metrics={"examples_per_s": 1000.0, "step_time_median_ms": 64.0},
                      fingerprint={"cpu_count": 2}, fingerprint_hash="fake-fp", config_hash=config.content_hash())


@pytest.fixture
def runner(monkeypatch):
    r = Counting()
    monkeypatch.setattr(cli_common, "local_runner", lambda timeout_s, device, threads=None: r)
    return r


def _one_line(err: str, *needles: str) -> str:
    line = err.strip()
    assert "\n" not in line and line.startswith("cubic: error:"), line
    for n in needles:
        assert n in line, (n, line)
    return line


def _plan(world: int, **update) -> dict:
    from sharding.from_config import plan_for

    wl = load_workload("dlrm-small")
    plan = plan_for(wl, Config(sharding=ShardingChoice(planner="greedy")), world).model_dump(mode="json")
    return {**plan, **update}


def test_cubic_run_rejects_each_unknown_value_at_load(tmp_path, capsys, runner, isolated):
    for body, field in BAD:
        (tmp_path / "c.yaml").write_text(body)
        code = cli.main(["run", "--workload", "dlrm-small", "--steps", "2", "--config", "c.yaml"])
        _, err = capsys.readouterr()
        assert code == 2, (body, err)
        _one_line(err, "c.yaml", field)
    assert runner.calls == 0 and TrialStore(isolated).count() == 0
    (tmp_path / "c.yaml").write_text("sharding: {planner: foo}\n")
    cli.main(["run", "--workload", "dlrm-small", "--config", "c.yaml"])
    assert "known: none, cubic, torchrec, greedy" in capsys.readouterr().err  # what the user may write instead


def test_an_unknown_compute_kernel_in_the_configs_plan_is_rejected(tmp_path, capsys, runner, isolated):
    table = load_workload("dlrm-small").tables[0].name
    plan = _plan(2, kernels={table: {"compute_kernel": "foo"}})
    (tmp_path / "c.json").write_text(json.dumps({"sharding": {"plan": plan}}))
    code = cli.main(["run", "--workload", "dlrm-small", "--world-size", "2", "--config", "c.json"])
    assert code == 2
    _one_line(capsys.readouterr().err, "c.json", f"sharding.plan.kernels.{table}.compute_kernel")
    assert runner.calls == 0 and TrialStore(isolated).count() == 0


def test_a_sharded_config_on_one_process_names_world_size(tmp_path, capsys, runner, isolated):
    (tmp_path / "c.yaml").write_text("sharding: {planner: greedy}\n")
    assert cli.main(["run", "--workload", "dlrm-small", "--config", "c.yaml"]) == 2
    line = _one_line(capsys.readouterr().err, "c.yaml", "sharding.planner", "--world-size N")
    assert "distributed runner" not in line
    # an explicit plan: the flag with the plan's own number of ranks, on one process and on the wrong number
    (tmp_path / "p.json").write_text(json.dumps({"sharding": {"plan": _plan(2)}}))
    assert cli.main(["run", "--workload", "dlrm-small", "--config", "p.json"]) == 2
    _one_line(capsys.readouterr().err, "p.json", "sharding.plan", "--world-size 2")
    assert cli.main(["run", "--workload", "dlrm-small", "--config", "p.json", "--world-size", "4"]) == 2
    _one_line(capsys.readouterr().err, "p.json", "sharding.plan.world_size", "--world-size 2")
    assert runner.calls == 0 and TrialStore(isolated).count() == 0


def test_campaign_baseline_and_sim_configs_are_checked_before_anything_is_recorded(tmp_path, capsys, isolated):
    (tmp_path / "bad.yaml").write_text("sharding: {planner: foo}\n")
    code = cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--budget", "1",
                     "--baseline", "bad.yaml", "--storage", f"sqlite:///{tmp_path}/c.db"])
    assert code == 2
    _one_line(capsys.readouterr().err, "bad.yaml", "sharding.planner")
    assert not (tmp_path / "c.db").exists() and TrialStore(isolated).count() == 0
    (tmp_path / "greedy.yaml").write_text("sharding: {planner: greedy}\n")  # a local campaign runs one process
    assert cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--budget", "1",
                     "--baseline", "greedy.yaml", "--storage", f"sqlite:///{tmp_path}/c.db"]) == 2
    _one_line(capsys.readouterr().err, "greedy.yaml", "--world-size")
    assert not (tmp_path / "c.db").exists() and TrialStore(isolated).count() == 0
    assert cli.main(["sim", "predict", "--workload", "dlrm-small", "--simulate", "h100x8", "--config", "bad.yaml"]) == 2
    _one_line(capsys.readouterr().err, "bad.yaml", "sharding.planner")


def test_every_listed_planner_passes_and_the_registry_builds_each():
    """One list of planner names: the check accepts each and sharding.registry builds each."""
    from sharding.registry import make_planner
    from sharding.types import NONE_NAMES, PLANNERS

    for name in (*PLANNERS, *NONE_NAMES):
        check_config_values(Config(sharding=ShardingChoice(planner=name)), source="c.yaml")
    for name in PLANNERS:
        if name != "torchrec":  # builds TorchRec's planner: imports torchrec (covered by the sharding tests)
            assert make_planner(name).plan  # an unknown name would raise SpecError
    with pytest.raises(SpecError, match=r"c.yaml: sharding.planner: unknown planner 'foo'"):
        check_config_values(Config(sharding=ShardingChoice(planner="foo")), source="c.yaml")


def test_the_local_runner_names_world_size_for_a_sharded_config():
    wl = load_workload("dlrm-small")
    why = validate_config(wl, Config(sharding=ShardingChoice(planner="greedy")))
    assert why.startswith("sharding.planner:") and "--world-size" in why and "distributed runner" not in why
    assert "unknown planner" in validate_config(wl, Config(sharding=ShardingChoice(planner="foo")))


def test_a_sharded_config_loads_where_it_can_run(tmp_path):
    """No false rejection: a planner config with --world-size 2, on the simulated cluster (any size),
    and a plan for exactly the run's ranks."""
    from cubic.cli.common import load_checked_config

    (tmp_path / "g.yaml").write_text("sharding: {planner: size_lookup_greedy}\n")
    assert load_checked_config(str(tmp_path / "g.yaml"), processes=2).sharding.planner == "size_lookup_greedy"
    assert load_checked_config(str(tmp_path / "g.yaml"), processes=None).sharding.planner == "size_lookup_greedy"
    (tmp_path / "p.json").write_text(json.dumps({"sharding": {"plan": _plan(2)}}))
    assert load_checked_config(str(tmp_path / "p.json"), processes=2).sharding.plan["world_size"] == 2


def test_2d_fields_that_cannot_work_on_the_runs_ranks_are_bad_input(tmp_path, capsys, isolated):
    """A group that does not divide --world-size, or replica sync without a 2D plan, were recorded as
    failed runs (exit 1) by the distributed runner; now refused at load, naming the field."""
    for body, field in (("sharding: {planner: greedy, group_size: 3}\n", "sharding.group_size"),
                        ("sharding: {planner: greedy, sync: weights}\n", "sharding.sync"),
                        ("sharding: {planner: greedy, group_size: 2, sync_interval: 5}\n", "sharding.sync_interval")):
        (tmp_path / "c.yaml").write_text(body)
        code = cli.main(["run", "--workload", "dlrm-small", "--world-size", "2", "--steps", "2", "--config", "c.yaml"])
        assert code == 2, body
        _one_line(capsys.readouterr().err, "c.yaml", field, "--world-size 2")
    # --plan with a config whose group size differs from the plan's
    (tmp_path / "p.json").write_text(json.dumps(_plan(2)))
    (tmp_path / "g.yaml").write_text("sharding: {group_size: 1}\n")
    code = cli.main(["run", "--workload", "dlrm-small", "--world-size", "2", "--steps", "2", "--config", "g.yaml",
                     "--plan", "p.json"])
    assert code == 2
    _one_line(capsys.readouterr().err, "g.yaml: sharding.group_size", "group_size 1 differs from the plan's group_size 2")
    (tmp_path / "b.yaml").write_text("batch_size: 128\n")  # was a recorded failed run: the runner's own check
    code = cli.main(["run", "--workload", "dlrm-small", "--world-size", "2", "--steps", "2", "--config", "b.yaml",
                     "--plan", "p.json"])
    assert code == 2
    _one_line(capsys.readouterr().err, "b.yaml: batch_size", "differs from the plan's per-rank batch")
    assert TrialStore(isolated).count() == 0
    # no false rejection: a 2D group that divides the ranks, with weight averaging
    (tmp_path / "ok.yaml").write_text("sharding: {planner: greedy, group_size: 1, sync: weights, sync_interval: 5}\n")
    assert cli_common.load_checked_config(str(tmp_path / "ok.yaml"), processes=2).sharding.group_size == 1


def _dlrm_sites() -> dict:
    from torch import nn

    from cubic.core.models import build_dense

    dense = build_dense(load_workload("dlrm-small"))
    return {f"dense.{n}": (m.in_features, m.out_features) for n, m in dense.named_modules() if isinstance(m, nn.Linear)}


def _placement_doc(sites: dict) -> dict:
    return {"workload": "dlrm-small", "module_filter": sorted(sites), "sites": {
        n: {"m": 512, "k": k, "n": out, "recipe": "tensorwise", "kernel": "scaled_mm_tensorwise", "safe": True}
        for n, (k, out) in sites.items()}}


def test_a_placement_for_another_model_is_bad_input_not_a_failed_run(tmp_path, capsys, runner, isolated):
    """A placement naming a site the workload's model lacks, or with another shape, was recorded as a
    failed run (the child's apply_placement refused it); now refused at load, naming the site."""
    sites = _dlrm_sites()
    first = sorted(sites)[0]
    k, n = sites[first]
    for bad, needle in (({"dense.layers.0.lcb.proj": (16, 16)}, "no linear site of this name"),
                        ({first: (k + 4, n)}, "shape mismatch")):
        (tmp_path / "c.json").write_text(json.dumps({"fp8": {"policy": "placement", "placement": _placement_doc(bad)}}))
        code = cli.main(["run", "--workload", "dlrm-small", "--steps", "2", "--config", "c.json"])
        assert code == 2
        _one_line(capsys.readouterr().err, "c.json", f"fp8.placement.sites.{next(iter(bad))}", needle)
    assert runner.calls == 0 and TrialStore(isolated).count() == 0
    # the placement that fits passes, and so does the local runner's check
    from cubic.core.config import FP8Choice
    from cubic.runners.base import check_placement_fits

    fits = Config(fp8=FP8Choice(policy="placement", placement=_placement_doc(sites)))
    check_placement_fits(fits.apply(load_workload("dlrm-small")), fits, source="c.json")
    assert validate_config(load_workload("dlrm-small"), fits) is None


def test_a_space_value_no_run_can_use_is_refused_before_the_campaign(tmp_path, capsys, isolated):
    """A space that can propose an unusable config (batch 0, a key that is no Config field, an unknown
    planner) made every such proposal a recorded failed run; now one line naming the space file and
    the parameter, before anything starts. A value enabled by another's (``when``) is tried with it."""
    head = "version: 1\nname: s\nobjectives: [{metric: examples_per_s}]\nparameters:\n"
    ok = ("  - {name: fp8.policy, type: categorical, choices: [\"off\", budget]}\n"
          "  - {name: fp8.budget_sqnr_db, type: categorical, choices: [20.0, 30.0], when: {fp8.policy: [budget]}}\n")
    for bad, needle in (("  - {name: batch_size, type: categorical, choices: [512, 0]}\n", "batch_size = 0"),
                        ("  - {name: foo.bar, type: int, low: 1, high: 4}\n", "not a Config field"),
                        ("  - {name: sharding.planner, type: categorical, choices: [none, nope]}\n", "unknown planner")):
        (tmp_path / "s.yaml").write_text(head + ok + bad)
        code = cli.main(["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--budget", "1", "--space",
                         "s.yaml", "--storage", f"sqlite:///{tmp_path}/c.db"])
        assert code == 2, bad
        _one_line(capsys.readouterr().err, "s.yaml", "parameters.2", needle)
        assert not (tmp_path / "c.db").exists() and TrialStore(isolated).count() == 0
    # no false rejection: budget_sqnr_db tried with the policy that enables it
    from cubic.cli.campaign import check_space_values
    from search.space import load_space

    (tmp_path / "s.yaml").write_text(head + ok)
    check_space_values(load_space(str(tmp_path / "s.yaml")), load_workload("dlrm-small"), "local", str(tmp_path / "s.yaml"))


def test_every_packaged_space_passes_its_own_value_check():
    from cubic.cli.campaign import DEFAULT_SPACES, check_space_values
    from search.space import load_space

    for kind, path in DEFAULT_SPACES.items():
        for name in ("dlrm-small", "wukong-small", "dmt-small", "wukong-large"):
            wl = load_workload(name)
            for shape in (False, True):
                space = load_space(path).model_copy(update={"shape": shape}).for_workload(wl)
                check_space_values(space, wl, kind, str(path))
