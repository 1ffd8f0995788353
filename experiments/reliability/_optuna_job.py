"""A user's Optuna study with cubic's sampler (reliability_inputs' ``job loaders`` class).

    python -m experiments.reliability._optuna_job KIND

KIND names an objective whose parameters Optuna takes and a cubic space does not hold as they are
(``none``: a categorical's None choice; ``seed``: an int range past 2**53; ``step``: a float step of
1e-16; ``name``: a 201-character name; ``control``: none of these). The study runs 6 trials with
``CubicSampler(seed=0)`` as README shows; exit 0 when every trial completed (said on stderr), 1 when
one did not. Before stop 61 each but the control stopped the study at its second trial with
pydantic's validation dump: a traceback, a defect.
"""

from __future__ import annotations

import sys

TRIALS = 6


def objective(kind: str):
    def f(trial) -> float:
        z = trial.suggest_float("z", 0, 1)
        if kind == "none":
            return z + (trial.suggest_categorical("norm", [None, "layer"]) is None)
        if kind == "seed":
            return z + trial.suggest_int("seed", 0, 2**62) % 7
        if kind == "step":
            return z + trial.suggest_float("x", 0, 1, step=1e-16)
        if kind == "name":
            return z + trial.suggest_float("w" * 201, 0, 1)
        return z + trial.suggest_int("n", 1, 8)
    return f


def main(argv: list[str]) -> int:
    import logging

    import optuna

    from search.optuna_sampler import CubicSampler

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("search.optuna_sampler").setLevel(logging.ERROR)  # its one warning is not the test
    study = optuna.create_study(sampler=CubicSampler(seed=0))
    study.optimize(objective(argv[0]), n_trials=TRIALS)
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    print(f"{done} of {TRIALS} trials COMPLETE", file=sys.stderr)
    return 0 if done == TRIALS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
