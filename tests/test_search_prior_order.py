"""Walking the step model's order (search.prior_order): the strategy ``prior-order``, the order each answer sets its
winner in, and the baseline ``--baselines`` runs where the campaign's runs have a step model."""

import json
import math

import numpy as np
import pytest

from cubic.cli.app import main
from cubic.codesign.campaign import Campaign
from search.prior_order import order_by_prior, prior_ranking
from search.space import Space
from search.strategies import SearchContext, make_strategy

SPACE = Space.model_validate({"version": 1, "name": "s", "objectives": [{"metric": "qps", "direction": "maximize"}],
                              "parameters": [{"name": "b", "type": "categorical", "choices": [1, 2, 4, 8, 16]}]})


class Model:
    """Predicts throughput grows with b, and no throughput at b=16 (an out-of-memory configuration)."""

    prior_columns = {"qps": 0}

    def __call__(self, point, context):
        return np.array([math.nan if point["b"] == 16 else math.log(10.0 * point["b"])])


def test_the_order_puts_what_the_model_expects_to_run_first_then_its_best_predicted():
    assert [p["b"] for p, _ in prior_ranking(SPACE, Model(), {})] == [8, 4, 2, 1, 16]
    # ties keep the given order; what the model gives no figure (NaN, -inf) goes last among its kind
    assert list(order_by_prior(np.array([1.0, np.nan, 2.0, 2.0, -np.inf]), np.array([1, 1, 1, 0, 1]))) == [2, 0, 1, 4, 3]
    assert prior_ranking(SPACE, None, {}) is None


def test_the_strategy_walks_the_order_k_per_round_and_says_each_ones_rank():
    c = Campaign(SPACE, lambda p: {"qps": float(p["b"])}, strategy="prior-order", budget=3, batch_size=2,
                 featurize=Model())
    c.run()
    runs = sorted(c.study.trials, key=lambda t: t.number)
    assert [t.params["b"] for t in runs] == [8, 4, 2]
    assert [t.user_attrs["predicted"]["source"] for t in runs] == [f"step model's order (#{i})" for i in (1, 2, 3)]
    assert runs[0].user_attrs["predicted"]["qps"] == pytest.approx(80.0)


def test_without_a_step_model_the_strategy_refuses_instead_of_searching_at_random():
    s = make_strategy("prior-order").bind(SearchContext(SPACE))
    with pytest.raises(ValueError, match="needs a step model"):
        s.propose([], 2)


def test_baselines_walk_the_step_models_order_beside_the_search_where_the_runs_have_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("version: 1\nname: s\nobjectives: [{metric: examples_per_s}]\nparameters:\n"
                                         "  - {name: batch_size, type: categorical, choices: [256, 1024, 4096]}\n")
    common = ["--storage", f"sqlite:///{tmp_path}/c.db", "--store", f"sqlite:///{tmp_path}/t.db", "--budget", "2",
              "--batch", "2", "--no-baseline", "--json", "--space", "space.yaml"]
    assert main(["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name", "c", "--baselines",
                 "--report", "rep", *common]) == 0
    names = [s["name"] for s in json.loads(capsys.readouterr().out)]
    assert names == ["c", "c-random", "c-tpe", "c-prior-order"]
    # the answer sets the search's winner against the order's (SIMULATED here: the model's ratio, no interval)
    said = [x for x in (tmp_path / "rep" / "answer.md").read_text().splitlines()
            if "against walking the step model's order (c-prior-order, 2 runs)" in x]
    assert len(said) == 1 and ("same winner" in said[0] or "in the model (SIMULATED, no interval)" in said[0]), said
    # a user's job has no step model: prior-order is no baseline of it, and asked for by name it is refused
    job = f"{tmp_path}/job.py"
    (tmp_path / "job.py").write_text("import sys\nprint('{\"examples_per_s\": %s}' % sys.argv[1])\n")
    assert main(["campaign", "run", "--objective", f"python {job} {{batch_size}}", "--name", "j",
                 "--strategy", "prior-order", *common]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--strategy" in err[0] and "step model" in err[0], err
