"""cubic's search as a Ray Tune searcher: ``Tuner(..., tune_config=TuneConfig(search_alg=CubicSearcher()))``.

One implementation of the search: the searcher keeps an in-memory Optuna study driven by
:class:`search.optuna_sampler.CubicSampler` (as Tune's own ``OptunaSearch`` drives Optuna's
samplers) and maps Tune's calls onto ask/tell:

- ``suggest(trial_id)``: ``study.ask`` over the search space (Tune's ``param_space``, converted by
  Tune's own ``OptunaSearch.convert_search_space``, or Optuna distributions), nested keys flattened
  with "/" as Tune does.
- ``on_trial_result``: the metric as an intermediate value (``trial.report`` at the result's
  ``training_iteration``), so a trial a scheduler stops has its learning curve in the study.
- ``on_trial_complete``: ``tell``: COMPLETE with the last metric; PRUNED when a scheduler (ASHA)
  stopped the trial before ``max_t`` iterations (CubicSampler learns from it through
  ``search.curves.credit_pruned``: its last report plus the complete trials' median gain after
  that iteration, never above the worst complete trial); FAIL on an error, or on a metric that is not a
  finite number (its ``fail_reason`` says what was reported; ``OptunaSearch`` stops the Tuner there).
- ``save`` / ``restore``: the finished trials (params, values, intermediate values, the
  sampler's state in their system attributes) as JSON, never pickle (a checkpoint is data, and
  loading it must not run code); a restored searcher rebuilds the sampler's state from them, as
  after an Optuna restart. Trials in flight at save time are Tune's to re-run.
"""

from __future__ import annotations

import json
import math
from typing import Any

import optuna
from optuna.trial import TrialState
from ray.tune.search import Searcher

from search.optuna_sampler import CubicSampler

CHECKPOINT_VERSION = 2  # what save writes and restore takes

optuna.logging.set_verbosity(optuna.logging.WARNING)


def to_distributions(space: dict[str, Any]) -> dict[str, optuna.distributions.BaseDistribution]:
    """Tune's param_space (tune.uniform, loguniform, choice, randint, ... possibly nested) or
    already Optuna distributions, as flat Optuna distributions ("a/b" for nested keys)."""
    from ray.tune.search.optuna import OptunaSearch
    from ray.tune.utils.util import flatten_dict

    flat = flatten_dict(space, prevent_delimiter=True)
    if all(isinstance(v, optuna.distributions.BaseDistribution) for v in flat.values()):
        return dict(flat)
    return dict(OptunaSearch.convert_search_space(space))


class CubicSearcher(Searcher):
    """Ray Tune searcher running cubic's proxy-guided search (through :class:`CubicSampler`).

    Args:
        space: Tune search space or Optuna distributions; default: the Tuner's ``param_space``.
        metric, mode: as for any Tune searcher (``"min"`` / ``"max"``).
        seed, batch_size: CubicSampler's.
        max_t: the iterations a full trial runs; a trial completed with fewer was stopped by a
            scheduler and is told as PRUNED (default: every completed trial is COMPLETE).
    """

    def __init__(self, space: dict[str, Any] | None = None, metric: str | None = None, mode: str | None = None,
                 *, seed: int | None = None, batch_size: int = 4, max_t: int | None = None):
        super().__init__(metric=metric, mode=mode)
        self._dists = to_distributions(space) if space else None
        self._seed, self._batch_size, self._max_t = seed, batch_size, max_t
        self._live: dict[str, optuna.trial.Trial] = {}
        self._study: optuna.Study | None = None
        if self._dists and mode:
            self._setup()

    def _setup(self, trials=()) -> None:
        if self._mode not in ("min", "max"):
            raise ValueError(f"CubicSearcher: mode must be 'min' or 'max', not {self._mode!r}")
        self._study = optuna.create_study(direction="minimize" if self._mode == "min" else "maximize",
                                          sampler=CubicSampler(seed=self._seed, batch_size=self._batch_size))
        for t in trials:
            self._study.add_trial(t)

    @property
    def study(self) -> optuna.Study:
        return self._study

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        if self._study is not None:
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._dists is None:
            self._dists = to_distributions(config)
        self._setup()
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        from ray.tune.utils.util import unflatten_dict

        if self._study is None:
            raise RuntimeError("CubicSearcher: no search space/metric/mode (pass them, or a Tuner param_space)")
        t = self._study.ask(fixed_distributions=self._dists)
        self._live[trial_id] = t
        return unflatten_dict(dict(t.params))

    def _value(self, result: dict | None) -> float | None:
        """The metric of one Tune result as a finite number; None when absent or not one (a string, a
        NaN): the trial's report, not the experiment, is what is wrong (it stopped the Tuner before)."""
        v = (result or {}).get(self._metric)
        if isinstance(v, str):  # a number sent as text ("0.25") is still that number
            try:
                v = float(v)
            except ValueError:
                return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        t, v = self._live.get(trial_id), self._value(result)
        if t is not None and v is not None:
            step = int(result.get("training_iteration", len(t.storage.get_trial(t._trial_id).intermediate_values) + 1))
            t.report(v, step)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        t = self._live.pop(trial_id, None)
        if t is None:
            return
        v = self._value(result)
        if error or v is None:
            if not error and result and self._metric in result:
                t.set_user_attr("fail_reason", f"metric {self._metric!r} reported as {result[self._metric]!r}: "
                                               "not a finite number")
            self._study.tell(t, state=TrialState.FAIL)
            return
        it = result.get("training_iteration")
        if self._max_t is not None and it is not None and it < self._max_t:
            t.report(v, int(it))
            self._study.tell(t, state=TrialState.PRUNED)
        else:
            self._study.tell(t, v)

    def _doc(self) -> dict[str, Any]:
        from optuna.distributions import distribution_to_json

        finished = [t for t in self._study.get_trials(deepcopy=True)
                    if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)] if self._study else []
        return {"version": CHECKPOINT_VERSION, "metric": self._metric, "mode": self._mode, "seed": self._seed,
                "batch_size": self._batch_size, "max_t": self._max_t,
                "dists": {k: distribution_to_json(d) for k, d in (self._dists or {}).items()},
                "trials": [{"state": t.state.name, "value": t.value, "params": t.params,
                            "distributions": {k: distribution_to_json(d) for k, d in t.distributions.items()},
                            "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
                            "user_attrs": t.user_attrs, "system_attrs": t.system_attrs} for t in finished]}

    def _load(self, s: dict[str, Any]) -> None:
        from optuna.distributions import json_to_distribution

        self._dists = {k: json_to_distribution(d) for k, d in s["dists"].items()} or None
        self._metric, self._mode = s["metric"], s["mode"]
        self._seed, self._batch_size, self._max_t = s["seed"], s["batch_size"], s["max_t"]
        self._live = {}
        self._setup([optuna.trial.create_trial(
            state=TrialState[t["state"]], value=t["value"], params=t["params"],
            distributions={k: json_to_distribution(d) for k, d in t["distributions"].items()},
            intermediate_values={int(k): v for k, v in t["intermediate_values"].items()},
            user_attrs=t["user_attrs"], system_attrs=t["system_attrs"]) for t in s["trials"]])

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "w") as f:
            json.dump(self._doc(), f)

    def restore(self, checkpoint_path: str) -> None:
        """Load :meth:`save`'s document; anything else is one ValueError naming the file (a torn or
        foreign checkpoint was a bare JSONDecodeError, TypeError or KeyError: 'dists')."""
        before = dict(self.__dict__)
        try:
            with open(checkpoint_path) as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else None!r}, "
                                 f"not {CHECKPOINT_VERSION}")
            self._load(doc)
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            self.__dict__.clear()
            self.__dict__.update(before)  # the searcher as it was, not half loaded
            raise ValueError(f"{checkpoint_path}: not a CubicSearcher checkpoint ({type(e).__name__}: "
                             f"{' '.join(str(e).split())})") from None

    # Tune pickles its TuneConfig (this searcher in it) when a Tuner is built, and an Optuna study
    # holds locks: the pickled form carries the checkpoint's document (finished trials) instead
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_study", "_live")}
        state["_checkpoint"] = self._doc() if self._study is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        doc = state.pop("_checkpoint")
        self.__dict__.update(state)
        self._live, self._study = {}, None  # not set up yet: set_search_properties will
        if doc is not None:
            self._load(doc)
