"""The embedding optimizer as an option: ``optimizers.embedding: ms_rowwise_adagrad`` in a workload or
a config; one replica is row-wise AdaGrad exactly; unknown names are rejected at load."""

import pytest
import torch

from cubic.core.config import Config, load_config
from cubic.core.models import RowWiseAdagrad
from cubic.core.spec import SpecError
from cubic.core.train import TrainSession
from cubic.core.workloads import load_workload
from tests.test_runners_distributed import SMALL


def _losses(optimizer, steps=3):
    cfg = Config.model_validate({"kernels": {"embedding": "torch"}, "optimizers": {"embedding": optimizer}})
    s = TrainSession(SMALL, cfg)
    assert s.workload.optimizers.embedding == optimizer
    return s.train(steps)


def test_ms_rowwise_adagrad_in_one_process_is_rowwise_adagrad():
    plain = _losses("rowwise_adagrad")
    assert _losses("ms_rowwise_adagrad") == plain
    assert _losses("sgd") != plain


def test_momentum_scaling_divides_the_accumulator_by_the_replicas():
    w1, w2 = (torch.nn.Parameter(torch.zeros(3, 2)) for _ in range(2))
    g = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    for w, c in ((w1, 1), (w2, 4)):
        w.grad = g.clone()
        RowWiseAdagrad([w], lr=0.1, eps=0.0, replicas=c).step()
    # row 0: m = 1; plain: 0.1 * 1 / 1; scaled: 0.1 * 1 / sqrt(1 / 4) = 0.2
    assert w1[0, 0].item() == pytest.approx(-0.1) and w2[0, 0].item() == pytest.approx(-0.2)
    assert w1[1].abs().sum() == 0 and w2[1].abs().sum() == 0  # untouched rows stay


def test_config_override_keeps_old_content_hashes():
    assert "optimizers" not in Config().model_dump()
    c = Config.model_validate({"optimizers": {"embedding": "ms_rowwise_adagrad"}})
    assert c.content_hash() != Config().content_hash()
    w = c.apply(load_workload("dlrm-small"))
    assert w.optimizers.embedding == "ms_rowwise_adagrad" and w.optimizers.embedding_lr == 0.05


def test_unknown_optimizer_is_rejected_at_load_naming_file_and_field(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("optimizers:\n  embedding: adamw\n")
    with pytest.raises(SpecError) as e:
        load_config(str(cfg))
    assert str(cfg) in str(e.value) and "optimizers.embedding" in str(e.value)
    doc = SMALL.model_dump(mode="json")
    doc["optimizers"]["embedding"] = "lamb"
    wl = tmp_path / "w.yaml"
    import yaml

    wl.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as e:
        load_workload(str(wl))
    assert str(wl) in str(e.value) and "optimizers.embedding" in str(e.value)


def test_cli_rejects_an_unknown_optimizer_with_exit_2(tmp_path, capsys):
    from cubic.cli.app import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("optimizers:\n  embedding: adamw\n")
    code = main(["run", "--workload", "dlrm-small", "--config", str(cfg), "--store", f"sqlite:///{tmp_path}/t.db"])
    err = capsys.readouterr().err
    assert code == 2 and str(cfg) in err and "optimizers.embedding" in err and err.count("\n") == 1
