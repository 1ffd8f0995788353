"""Hostile campaign names through the real CLI: a name never becomes a path outside .cubic/
(the full list runs in `python -m experiments.reliability`)."""

import pytest

from cubic.core.paths import safe_name, under
from experiments.reliability.readback import hostile_names


def test_names_become_one_safe_component():
    for name in ("../../../escaped", "/abs", "..", ".", "a/b", "x\x00y", "é", "a" * 300):
        s = safe_name(name)
        assert "/" not in s and not s.startswith(".") and 0 < len(s) <= 80 and s.isascii()
    assert safe_name("plain-name_1.0") == "plain-name_1.0"
    assert safe_name("a/b") != safe_name("a_b")  # changed names keep a hash of the original


def test_under_refuses_a_symlink_out(tmp_path):
    from cubic.core.spec import SpecError

    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert under(tmp_path / "root", "../x") == tmp_path / "root" / safe_name("../x")
    with pytest.raises(SpecError):
        under(tmp_path / "root", "link")


@pytest.mark.slow  # 15 s end to end; safe_name/under are tested above
def test_campaign_names_that_look_like_paths_stay_inside_dot_cubic(tmp_path):
    out = hostile_names(tmp_path, names=("../../../escaped", "/tmp/cubic-escaped-abs"))
    assert out["escaped"] == 0 and out["crashes"] == 0 and out["ran"] == 2, out["details"]
