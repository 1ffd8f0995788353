"""cost_models.two_d_quality: the measured NE cost table of 2D sparse parallelism the simulator assumes."""

from __future__ import annotations

import json

import pytest

from cost_models import two_d_quality as q
from cubic.core.spec import SpecError

TABLE = {
    "provenance": {"run": "experiments/two_d.py", "date": "2026-01-01T00:00:00Z", "code_version": "abc",
                   "measured_on": "CPU gloo, 4 processes, two_d", "quick": False},
    "entries": [
        {"optimizer": "rowwise_adagrad", "sync": "gradients", "interval": 1, "ne_cost_rel": 0.0,
         "ci95": [-1e-4, 1e-4]},
        {"optimizer": "rowwise_adagrad", "sync": "weights", "interval": 10, "ne_cost_rel": 0.001, "ci95": [0.0, 0.002]},
        {"optimizer": "rowwise_adagrad", "sync": "weights", "interval": 100, "ne_cost_rel": 0.02,
         "ci95": [0.01, 0.03]},
    ],
}


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "two_d_quality.json"
    path.write_text(json.dumps(TABLE))
    return path


def test_the_packaged_table_is_measured_with_provenance_and_covers_both_sync_modes():
    doc = q.load()
    assert doc["kind"] == "measured"
    assert {"run", "date", "code_version", "measured_on"} <= set(doc["provenance"])
    assert "gloo" in doc["provenance"]["measured_on"]
    syncs = {(e["optimizer"], e["sync"]) for e in doc["entries"]}
    assert {("rowwise_adagrad", "gradients"), ("rowwise_adagrad", "weights")} <= syncs
    e = next(e for e in doc["entries"] if e["sync"] == "weights" and e["optimizer"] == "rowwise_adagrad")
    got = q.ne_cost("rowwise_adagrad", "weights", e["interval"])
    assert got.kind == "measured" and got.ne_cost_rel == e["ne_cost_rel"] and q.DATA.name in got.source


def test_a_measured_interval_is_measured_others_are_modelled_from_the_nearest_two(table):
    m = q.ne_cost("rowwise_adagrad", "weights", 100, path=table)
    assert (m.kind, m.ne_cost_rel, m.ci95) == ("measured", 0.02, (0.01, 0.03))
    assert "measured" in m.source and table.name in m.source and "gloo" in m.source
    mid = q.ne_cost("rowwise_adagrad", "weights", 55, path=table)
    assert mid.kind == "modelled" and mid.ne_cost_rel == pytest.approx(0.0105) and "interpolated" in mid.source
    far = q.ne_cost("rowwise_adagrad", "weights", 190, path=table)
    assert far.kind == "modelled" and far.ne_cost_rel == pytest.approx(0.039) and "extrapolated" in far.source
    # per-step gradient sync has one interval by definition
    assert q.ne_cost("rowwise_adagrad", "gradients", 100, path=table).kind == "measured"


def test_nothing_is_invented_for_an_optimizer_the_table_lacks(table):
    assert q.ne_cost("sgd", "weights", 100, path=table) is None


@pytest.mark.parametrize("broken, field", [
    ({"entries": "x", "provenance": {}}, "entries"),
    ({"entries": []}, "provenance"),
    ({"entries": [{"optimizer": "sgd", "sync": "sometimes", "interval": 1, "ne_cost_rel": 0, "ci95": [0, 0]}],
      "provenance": {}}, "entries[0]"),
])
def test_a_malformed_table_names_the_file_and_field(tmp_path, broken, field):
    path = tmp_path / f"bad{len(field)}.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(SpecError) as e:
        q.load(path)
    assert e.value.field == field and str(path) in str(e.value)


def test_a_measured_cost_names_its_paired_seeds():
    """The packaged table gives each entry its own seed count (two_d's resolved targets have more):
    the source a simulated run cites says how many seeds stand behind the figure."""
    from cost_models import two_d_quality

    doc = two_d_quality.load(two_d_quality.DATA)
    for e in doc["entries"]:
        got = two_d_quality.ne_cost(e["optimizer"], e["sync"], e["interval"])
        assert got.kind == "measured" and got.source.endswith(f", {e['seeds']} paired seeds")
