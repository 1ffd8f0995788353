"""Public test problems for the search benchmark, from their documented formulas (no data files).

- ``branin`` (2-d, Dixon & Szego 1978; as in Optuna's and BoTorch's test suites): minimum 0.397887.
- ``hartmann6`` (6-d, Hartmann 1973; BoTorch/HPOlib): minimum -3.32237.
- ``levy4`` (4-d on [-10, 10], Levy & Montalvo 1985; as in the sfu.ca test-function library): minimum 0.
- ``mlp-tabular`` (an HPOBench-style tabular surrogate, generated here): 4 discrete hyperparameters
  of a small MLP (learning rate on a log grid, batch size, width, optimizer) whose validation loss
  follows a documented formula (below) plus a fixed per-cell noise drawn from the cell's hash, as
  tabular benchmarks (HPOBench, LCBench) hold one measured value per cell. Its intermediate values
  (a learning curve over 9 epochs) serve the early-stopping benchmark.

Each problem: ``suggest(trial) -> point``, ``value(point) -> float`` (minimize), ``optimum`` (the
known minimum, or the table's minimum), and ``curve(point)`` where it has one. Relative regret of a
best value b is (b - optimum) / (median of random points - optimum): 1 is a random point's typical
value, 0 the optimum.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


def branin(p):
    x, y = p["x1"], p["x2"]
    return ((y - 5.1 / (4 * math.pi ** 2) * x * x + 5 / math.pi * x - 6) ** 2
            + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x) + 10)


_H6_A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
                  [17, 8, 0.05, 10, 0.1, 14]])
_H6_P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                         [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])
_H6_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def hartmann6(p):
    x = np.array([p[f"x{i}"] for i in range(1, 7)])
    return float(-np.sum(_H6_ALPHA * np.exp(-np.sum(_H6_A * (x - _H6_P) ** 2, axis=1))))


def levy4(p):
    w = 1 + (np.array([p[f"x{i}"] for i in range(1, 5)]) - 1) / 4
    return float(math.sin(math.pi * w[0]) ** 2
                 + np.sum((w[:-1] - 1) ** 2 * (1 + 10 * np.sin(math.pi * w[:-1] + 1) ** 2))
                 + (w[-1] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[-1]) ** 2))


MLP_LR = [10 ** e for e in np.linspace(-4.5, -0.5, 9)]
MLP_BATCH = [16, 32, 64, 128, 256, 512]
MLP_WIDTH = [16, 32, 64, 128, 256, 512]
MLP_OPT = ["sgd", "momentum", "adam"]
EPOCHS = 9


def _cell_key(p) -> str:
    """A cell's configuration as text no library version changes: numbers as Python writes them.
    (``repr`` of a numpy float is ``np.float64(...)`` under numpy 2 and the bare number under 1.x, so
    hashing it made the registered problem, whose learning rates are numpy floats, another draw of
    the table than the user script's, whose are floats from its command line.)"""
    plain = {k: float(v) if isinstance(v, (float, np.floating)) else int(v) if isinstance(v, np.integer) else v
             for k, v in p.items()}
    return repr(sorted(plain.items()))


def _cell_noise(p, salt: str) -> float:
    h = int(hashlib.sha256((salt + _cell_key(p)).encode()).hexdigest()[:12], 16)
    return float(np.random.default_rng(h).standard_normal())


def _mlp_final(p) -> tuple[float, float, float]:
    """(the loss training tends to, log10 of the learning rate over the best one, the learning-rate
    penalty): the best learning rate depends on the optimizer and the batch size (linear scaling), width helps
    with diminishing returns, and a learning rate too high diverges; the loss carries a fixed
    per-cell noise (sd 0.02)."""
    opt_lr = {"sgd": -1.5, "momentum": -2.2, "adam": -3.0}[p["opt"]] + 0.5 * math.log10(p["batch"] / 128)
    off = math.log10(p["lr"]) - opt_lr
    lr_pen = 0.35 * off ** 2
    diverge = 2.0 if off > 1.2 else 0.0
    final = (0.25 + lr_pen + diverge + 0.3 / math.sqrt(p["width"] / 16) + 0.04 * math.log2(p["batch"] / 16)
             + {"sgd": 0.08, "momentum": 0.03, "adam": 0.0}[p["opt"]] + 0.02 * _cell_noise(p, "final"))
    return final, off, lr_pen


def mlp_curve(p) -> list[float]:
    """Validation loss after each epoch, from 2.5 towards :func:`_mlp_final`'s loss (the last epoch's
    is the problem's value): a badly tuned learning rate also learns slowly, so early epochs rank
    configurations much as the last does."""
    final, _, lr_pen = _mlp_final(p)
    speed = 0.6 / (1 + lr_pen)
    return [final + (2.5 - final) * math.exp(-speed * e) for e in range(1, EPOCHS + 1)]


def mlp_curve_crossing(p) -> list[float]:
    """The same configurations and final losses as :func:`mlp_curve` on paths that cross: a higher
    learning rate and a narrower net learn faster early (speed ~ 10^(1.5 x log10(lr / best lr)) x
    (16 / width)^0.5), so a fast starter leads at first and a slow one that ends best trails until
    late (among the best configurations, early epochs say next to nothing of the final ranking:
    experiments/_search_early_stop.curve_agreement measures it). The check of early stopping that
    its pruners and the credit of stopped runs were not tuned on."""
    final, off = mlp_curve(p)[-1], _mlp_final(p)[1]
    speed = min(5.0, max(0.02, 0.5 * 10 ** (1.5 * off) * (16 / p["width"]) ** 0.5))
    end = math.exp(-speed * EPOCHS)  # normalised so that the last epoch is mlp_curve's last exactly
    return [final + (2.5 - final) * (math.exp(-speed * e) - end) / (1 - end) for e in range(1, EPOCHS + 1)]


CURVES = {"ordered": mlp_curve, "crossing": mlp_curve_crossing}  # the user script's --curves


def mlp_value(p) -> float:
    return mlp_curve(p)[-1]


@dataclass(frozen=True)
class Problem:
    name: str
    suggest: Callable[[Any], dict]
    value: Callable[[dict], float]
    optimum: float
    source: str
    curve: Callable[[dict], list[float]] | None = None


def _floats(names, lo, hi):
    return lambda t: {n: t.suggest_float(n, lo, hi) for n in names}


def _mlp_suggest(t):
    return {"lr": t.suggest_categorical("lr", MLP_LR), "batch": t.suggest_categorical("batch", MLP_BATCH),
            "width": t.suggest_categorical("width", MLP_WIDTH), "opt": t.suggest_categorical("opt", MLP_OPT)}


def _mlp_optimum() -> float:
    import itertools

    return min(mlp_value({"lr": a, "batch": b, "width": c, "opt": d})
               for a, b, c, d in itertools.product(MLP_LR, MLP_BATCH, MLP_WIDTH, MLP_OPT))


def problems() -> dict[str, Problem]:
    return {
        "branin": Problem("branin", lambda t: {"x1": t.suggest_float("x1", -5, 10), "x2": t.suggest_float("x2", 0, 15)},
                          branin, 0.397887, "Dixon & Szego 1978 (Optuna/BoTorch test suites)"),
        "hartmann6": Problem("hartmann6", _floats([f"x{i}" for i in range(1, 7)], 0.0, 1.0), hartmann6, -3.32237,
                             "Hartmann 1973 (BoTorch/HPOlib)"),
        "levy4": Problem("levy4", _floats([f"x{i}" for i in range(1, 5)], -10.0, 10.0), levy4, 0.0,
                         "Levy & Montalvo 1985 (sfu.ca test-function library)"),
        "mlp-tabular": Problem("mlp-tabular", _mlp_suggest, mlp_value, _mlp_optimum(),
                               "HPOBench-style tabular surrogate generated from the formula in mlp_curve",
                               curve=mlp_curve),
    }


def random_median(problem: Problem, n: int = 2000, seed: int = 12345) -> float:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    vals = []
    for _ in range(n):
        t = study.ask()
        vals.append(problem.value(problem.suggest(t)))
        study.tell(t, vals[-1])
    return float(np.median(vals))
