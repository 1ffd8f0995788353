"""The cubic planner's time budget: a plan whose search ran into it says so (a slower or busier
machine may return another plan); without one (``--time-budget 0``) the same inputs give the same
plan."""

import json

import pytest

from cubic.cli.app import main
from cubic.core.workloads import generate_tables
from sharding.estimate import LearnedEstimator
from sharding.planners import budget_note
from sharding.registry import make_planner
from tests.test_sharding_portfolio import topo_for


@pytest.fixture(scope="module")
def task():
    tables = generate_tables(30, seed=21)
    return tables, topo_for(tables, 4, 4), LearnedEstimator()


def test_a_search_cut_by_its_budget_says_so_in_the_plan(task):
    tables, topo, est = task
    planner = make_planner("cubic", estimator=est, target="torchrec", time_budget_s=1e-6)
    plan = planner.plan(tables, topo, 256)
    assert planner.budget_reached_ and plan.notes.endswith(budget_note(1e-6))


def test_without_a_budget_the_same_inputs_give_the_same_plan(task):
    tables, topo, est = task
    plans = []
    for _ in range(2):
        planner = make_planner("cubic", estimator=est, target="torchrec", time_budget_s=0)
        plans.append(planner.plan(tables, topo, 256))
        assert not planner.budget_reached_ and "time budget" not in plans[-1].notes
    assert plans[0].shards == plans[1].shards
    # the search's own limits end it; a generous budget gives the same plan (it was not cut either)
    roomy = make_planner("cubic", estimator=est, target="torchrec", time_budget_s=60).plan(tables, topo, 256)
    assert roomy.shards == plans[0].shards


def test_the_cli_warns_when_the_budget_cut_the_search_and_refuses_a_negative_one(tmp_path, capsys):
    out = tmp_path / "plan.json"
    args = ["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--memory-gb", "2", "--no-check"]
    assert main(args + ["--time-budget", "0.000001", "--out", str(out)]) == 0
    assert f"warning: {budget_note(0.000001)}" in capsys.readouterr().err
    assert "time budget" in json.loads(out.read_text())["notes"]
    assert main(args + ["--time-budget", "0"]) == 0
    assert "time budget" not in capsys.readouterr().err
    assert main(args + ["--time-budget", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--time-budget" in err and len(err.splitlines()) == 1
