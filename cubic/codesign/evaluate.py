"""cubic's own evaluate: a point -> a Config -> repeats of the run on a Runner, recorded in the trial
store and served from it (:class:`RunnerEvaluate`)."""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from cubic.core.result import Result
from cubic.core.spec import SpecError
from cubic.codesign.storage import META_KEY
from search.space import Space

if TYPE_CHECKING:
    from cubic.codesign.campaign import Campaign

from cubic.runners.local import expected_fingerprint_hash  # noqa: E402,F401  (the one implementation)


# NE and loss compared at an EQUAL TRAINING BUDGET (examples seen), not after equal steps: batch 4096
# after 10 steps has seen 8x the examples of batch 512. The budget of a campaign is its smallest
# batch x its steps (warm-up included); a larger batch's NE/loss at that budget is read from its
# evaluation trajectory (linear in examples seen between evaluation points).
AT_BUDGET = {"ne_end": "ne_at_budget", "loss_end": "loss_at_budget"}


def at_examples(trajectory: list[dict[str, float]], batch_size: int, examples: float, key: str) -> float | None:
    """``key`` (ne, loss) of a run's trajectory ([{step, loss, ne}], step = training steps done) at
    ``examples`` examples seen, linearly interpolated; None past the trajectory's end or without it."""
    pts = sorted((float(p["step"]) * batch_size, float(p[key])) for p in trajectory or [] if key in p and "step" in p)
    if not pts or examples > pts[-1][0] * (1 + 1e-9):
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= examples <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (examples - x0) / (x1 - x0)
    return pts[0][1] if examples <= pts[0][0] else pts[-1][1]


def budget_metrics(result: Result, batch_size: int | None, examples: float | None) -> dict[str, float]:
    """``ne_at_budget`` / ``loss_at_budget`` of ``result`` at ``examples`` examples seen (and the
    budget itself as ``examples_budget``); empty when either is unknown."""
    if not examples or not batch_size or not result.ok:
        return {}
    out = {"examples_budget": float(examples)}
    for key, name in (("ne", "ne_at_budget"), ("loss", "loss_at_budget")):
        v = at_examples(result.trajectory, batch_size, examples, key)
        if v is not None:
            out[name] = v
    return out if len(out) > 1 else {}


def batch_sizes(space: Space, workload) -> tuple[int, int]:
    """The smallest and largest batch the space can run (the workload's when it has no batch knob)."""
    p = next((p for p in space.parameters if p.name == "batch_size"), None)
    if p is None:
        return int(workload.batch_size), int(workload.batch_size)
    if p.type == "categorical":
        sizes = [int(c) for c in p.choices]
        return min(sizes), max(sizes)
    return int(p.low), int(p.high)


def equal_budget(space: Space, workload, steps: int, warmup: int) -> float:
    """The campaign's training budget in examples: the smallest batch the space can run x the
    steps (warm-up included)."""
    return float(batch_sizes(space, workload)[0] * (steps + warmup))


def examples_text(n: float | None) -> str:
    """A count of examples as printed (the budget, where an NE was read): a whole number."""
    return "?" if n is None else f"{int(round(n)):,}"


# A run whose batch is larger than the budget has not made one update within it: its NE "at the
# budget" lies between its untrained start and its first update, which says how it starts, not
# what it learns. The hint asks for enough steps that such a batch makes a few updates within the
# budget (a rule of thumb, not a measured threshold).
QUALITY_UPDATES = 10


def one_update_caveat(examples: float | None, batch_size: float | None, steps: int, warmup: int,
                      who: str) -> str | None:
    """The caveat for ``who`` (batch ``batch_size``) when it makes less than one update within the
    equal budget of ``examples`` (the smallest batch x ``steps + warmup``), with the ``--steps`` that
    gives it QUALITY_UPDATES updates there; None when it makes at least one."""
    if not examples or not batch_size or examples >= batch_size or steps + warmup <= 0:
        return None
    smallest = examples / (steps + warmup)
    need = max(1, math.ceil(QUALITY_UPDATES * batch_size / smallest) - warmup)
    return (f"{who} (batch {int(batch_size):,}) makes {examples / batch_size:.2f} of one update within the equal "
            f"budget of {examples_text(examples)} examples: its NE there lies between its untrained start and "
            f"its first update, so NE at the budget says how the runs start, not what they learn; --steps {need} "
            f"gives it {QUALITY_UPDATES} updates within the budget")


def _noted(result: Result, default_metrics: dict[str, float] | None = None, **notes: Any) -> Result:
    """A copy of ``result`` with the campaign's notes (RUN_NOTES) in its extra and metrics it lacks
    added; the stored or served Result itself is left as it is."""
    metrics = dict(result.metrics)
    for k, v in (default_metrics or {}).items():
        metrics.setdefault(k, v)
    return result.model_copy(update={"metrics": metrics, "extra": {**result.extra, **notes}})


def attach_campaign(store, campaign: "Campaign", workload: str) -> None:
    """The campaign's row in ``store`` (none: nothing), created once so trials can carry its id; a
    replaced campaign of the same name takes its new settings, not the old ones."""
    if store is None:
        return
    spec = campaign.study.user_attrs.get(META_KEY, {})
    row = store.get_campaign(campaign.name)
    if row is None:
        store.create_campaign(campaign.name, spec=spec, workload=workload)
    elif row.spec != spec:
        store.update_campaign(campaign.name, spec=spec, workload=workload, status="running")


class RunnerEvaluate:
    """cubic's evaluate: point -> Config -> runs on ``runner`` (local, Ray, simulated) -> metrics.

    A measurement is a distribution: each evaluation wants ``repeats`` repeats of the run (each a
    fresh child process for local runs), and every repeat is recorded in the trial store with the
    campaign's name and its attempt number. What the campaign (and its proxy) sees is the repeats'
    pooled estimate (cubic.core.stats: median, 95% interval, contended repeats excluded), never one
    sample. Repeats already stored for the config on this fingerprint with the same steps are served
    instead of run again (also what makes a resumed campaign cheap); only the missing ones run.
    ``remeasure=True`` runs ``repeats`` fresh repeats for every evaluation and pools them with the
    stored ones. A deterministic failure (oom, nan, invalid, error) is stored under the real
    fingerprint and served like a success.

    A store write that fails raises :class:`cubic.core.store.StoreError` (the row is kept in the
    pending file): the campaign stops with a store error instead of recording a failed run. An
    interrupted run is recorded as ``killed`` and the interrupt goes on.
    """

    def __init__(self, workload, runner, space: Space, *, steps: int = 20, warmup: int = 3, store=None,
                 campaign: str | None = None, base_config=None, repeats: int = 1, remeasure: bool = False):
        if repeats < 1:
            raise SpecError("must be >= 1", field="repeats")
        self.workload, self.runner, self.space = workload, runner, space
        self.steps, self.warmup = steps, warmup
        resolve = getattr(runner, "resolve_config", None)
        if callable(resolve):  # the simulator's reading of an unset dense dtype (bf16), as `cubic run --simulate`
            base_config = resolve(base_config)  # and `cubic sim` read it: a campaign's baseline config read fp32
        self.store, self.campaign, self.base_config = store, campaign, base_config
        self.repeats, self.remeasure = repeats, remeasure
        self.budget_examples: float | None = None  # set: NE/loss also at this equal budget (AT_BUDGET)
        self.served = 0  # evaluations served from the store without a run
        self.runs = 0  # repeats run
        self._fp: tuple[str | None] | None = None
        self._local: dict[str, list] = {}  # ok repeats per config when nothing is stored
        self._last: dict[str, Result] = {}  # each config's latest run, for a paired comparison

    @property
    def deterministic(self) -> bool:
        """A source that gives the same figure every time (the simulator): the confirm step repeats nothing."""
        return getattr(self.runner, "source", "measured") == "simulated"

    def attach(self, campaign: "Campaign") -> None:
        """Create the campaign's row in the trial store (once) so trials can carry its id."""
        self.campaign = campaign.name
        attach_campaign(self.store, campaign, self.workload.name)

    # ---- keys and what is stored ----------------------------------------------------------------
    def _fingerprint(self) -> str | None:
        if self._fp is None:
            self._fp = (expected_fingerprint_hash(self.runner),)
        return self._fp[0]

    def _key(self, config) -> tuple:
        return (self.workload.content_hash(), config.content_hash(), self._fingerprint(),
                getattr(self.runner, "source", "measured"))

    def _stored(self, config):
        """:class:`cubic.core.store.Served` for ``config`` (from the store, or this object's own
        repeats when there is no store)."""
        from cubic.core.store import Served

        if self.store is not None and self._fingerprint() is not None:
            return self.store.serve(*self._key(config), steps=self.steps, warmup=self.warmup,
                                    threads=getattr(self.runner, "threads", None))
        ok = self._local.get(config.content_hash(), [])
        if not ok:
            return Served(None, [])
        from cubic.core.stats import INTERVAL_METRICS, Repeat, contention, cores_available, noise_models, pool, \
            pooled_result
        from cubic.core.store import ASSUMED_NOISE_FLOOR

        measured = getattr(self.runner, "source", "measured") == "measured"
        key = config.content_hash()  # the machine's noise from the other configs (this one's spread is its own)
        noise = noise_models([[r.metrics for r in g] for k, g in self._local.items() if k != key]) if measured else None
        floor = {k: ASSUMED_NOISE_FLOOR for k in INTERVAL_METRICS} if measured else None
        p = pool([Repeat(dict(r.metrics), contention(r.metrics, r.extra, cores_available(r.fingerprint)) is not None)
                  for r in ok], noise, floor)
        return Served(pooled_result(ok, p), [], p)

    def _config(self, point: dict[str, Any]):
        return self.space.to_config(point, self.base_config)

    # ---- evaluate ---------------------------------------------------------------------------------
    def __call__(self, point: dict[str, Any]) -> Result:
        config = self._config(point)
        try:
            config.apply(self.workload)
        except SpecError as e:  # nothing ran: labelled as the runner's runs are (measured or simulated)
            return Result.failed("invalid", str(e), source=getattr(self.runner, "source", "measured"))
        return self._measure(config, self.repeats, fresh=self.remeasure)

    def add_repeat(self, point: dict[str, Any], n: int = 1) -> Result:
        """Run ``n`` fresh repeats of ``point`` and return its new pooled estimate (confirm phase)."""
        return self._measure(self._config(point), n, fresh=True)

    def estimate(self, point: dict[str, Any], metric: str):
        """The pooled :class:`cubic.core.stats.Estimate` of ``metric`` for ``point`` from the repeats
        stored so far (None when there is no successful one)."""
        from cubic.core.stats import ci_names, estimate

        served = self._stored(self._config(point))
        if served.result is None or not served.result.ok or metric not in served.result.metrics:
            return None
        if metric in served.pooled.estimates:  # examples/s, step time: pooled with the machine's noise
            return served.pooled.estimates[metric]
        used = set(served.pooled.trial_ids)
        rows = [t.result.metrics for t in served.trials if t.id in used] if served.trials else \
            [r.metrics for r in self._local.get(self._config(point).content_hash(), [])]
        vals = [m[metric] for m in rows if metric in m] or [served.result.metrics[metric]]
        lo, hi = ci_names(metric)
        m = served.result.metrics
        within = (m[lo], m[hi]) if len(vals) == 1 and lo in m and hi in m else None
        return estimate(vals, within)

    def run_value(self, point: dict[str, Any], metric: str) -> float | None:
        """``metric`` of ``point``'s latest run in this process (None when it failed, was contended or
        has no such figure): one side of a pair measured back to back (the confirm step's speedup)."""
        return _run_value(self._last.get(self._config(point).content_hash()), metric)

    def contended_value(self, point: dict[str, Any], metric: str) -> float | None:
        """``metric`` of ``point``'s latest run when it succeeded but was contended (else None): a pair
        whose two runs shared a loaded moment, used only when no two clean pairs are left."""
        return _run_value(self._last.get(self._config(point).content_hash()), metric, contended=True)

    def ensure_noise_floor(self, point: dict[str, Any], repeats: int = 5) -> str | None:
        """Measure this machine's noise floor when it has none that is fresh (the store's
        NOISE_FLOOR_MAX_AGE_DAYS / cubic release rule): ``point`` repeated in fresh processes up to
        ``repeats`` uncontended repeats, their between-process spread stored per machine
        fingerprint. Returns what it did in one line (None: nothing to do)."""
        fp = self._fingerprint()
        if self.store is None or fp is None or getattr(self.runner, "source", "measured") != "measured":
            return None
        floors, why = self.store.noise_floor(fp)
        if floors:
            return None
        config = self._config(point)
        served = self._stored(config)
        have = served.good if served.result is not None and served.result.ok else 0
        if repeats - have > 0:
            out = self._measure(config, repeats - have, fresh=True)
            if not out.ok:
                return f"the noise floor's repeats failed ({out.failure_kind}); intervals use an assumed floor"
        from cubic.core.stats import INTERVAL_METRICS

        served = self._stored(config)
        used = set(served.pooled.trial_ids) if served.pooled else set()
        vals = {k: [t.result.metrics[k] for t in served.trials if t.id in used and k in t.result.metrics]
                for k in INTERVAL_METRICS}
        how = {"workload": self.workload.name, "config_hash": config.content_hash(), "steps": self.steps,
               "warmup": self.warmup}
        got = self.store.record_noise_floor(fp, vals, how)
        m = got.get("examples_per_s")
        if m is None:
            return "the noise floor could not be measured (no two good repeats); intervals use an assumed floor"
        return (f"measured this machine's noise floor ({why}): {m.df + 1} fresh runs of the baseline, "
                f"examples/s spread {m.sd * 100:.1f}% between processes")

    def _measure(self, config, repeats: int, fresh: bool) -> Result:
        served = self._stored(config)
        if not fresh and served.satisfies(repeats):
            self.served += 1
            return _noted(served.result, self._budget(config, served.result), served_from_store=True,
                          trial_id=served.trials[-1].id if served.trials else None,
                          trial_ids=[t.id for t in served.trials])
        need = repeats if (fresh or served.result is None or served.failure) else max(1, repeats - served.good)
        wall = 0.0
        for _ in range(need):
            result, tid = self._run_once(config)
            wall += result.wall_time_s
            if not result.ok:  # a failed repeat is the answer: deterministic ones are served from now on
                return _noted(result, trial_id=tid)
        served = self._stored(config)
        return _noted(served.result, {"wall_time_s": wall, **self._budget(config, served.result)},
                      trial_id=served.trials[-1].id if served.trials else None,
                      trial_ids=[t.id for t in served.trials], repeats_run=need)

    def _budget(self, config, result: Result) -> dict[str, float]:
        if self.budget_examples is None or result is None:
            return {}
        try:
            batch = config.apply(self.workload).batch_size
        except SpecError:
            return {}
        return budget_metrics(result, batch, self.budget_examples)

    def _run_once(self, config):
        """One repeat: run, record (with its attempt number), return (Result, trial id)."""
        from cubic.core.result import RunInterrupted

        key = self._key(config)
        attempt = 1
        if self.store is not None and key[2] is not None:
            attempt = self.store.next_attempt(*key, steps=self.steps, warmup=self.warmup)
        try:
            result = self.runner.run(self.workload, config, steps=self.steps, warmup=self.warmup)
        except RunInterrupted as e:  # the parent was interrupted: record the run as killed, then stop
            self._record(config, e.result, attempt)
            raise
        self.runs += 1
        self._last[config.content_hash()] = result
        tid = self._record(config, result, attempt)
        if result.ok and (self.store is None or key[2] is None):
            self._local.setdefault(config.content_hash(), []).append(result)
        if result.failure_kind == "killed" and (result.extra or {}).get("interrupted") == "SIGINT":
            raise RunInterrupted(result)  # Ctrl-C reached the run's process group: the campaign stops too
        return result, tid

    def _record(self, config, result, attempt: int) -> int | None:
        if self.store is None:
            return None
        return self.store.record(self.workload, config, result, campaign=self.campaign, attempt=attempt,
                                 steps=self.steps, warmup=self.warmup, fingerprint_hash=self._fingerprint())



class JobEvaluate:
    """A user's job (``--objective``) as the campaign's evaluate: ``runner`` (a
    :class:`cubic.runners.command.CommandRunner`) runs each point, and every run -- failures,
    retries, the baseline's and the confirm step's included -- is recorded in the trial store
    (when one is given) keyed by the job's command line and the values
    (:class:`cubic.core.config.JobConfig`), with the campaign's name and its attempt number. Nothing
    is served from the store: a job's result depends on files its command line does not name (the
    script's own code), so each point is run; the campaign's Optuna storage keeps its repeats."""

    served = 0

    def __init__(self, runner, job: dict[str, Any], store=None, campaign: str | None = None):
        from cubic.core.config import JobConfig

        self.runner, self.store, self.campaign = runner, store, campaign
        self.job = JobConfig(command=job["objective"], launcher=job.get("launcher"), nproc=job.get("nproc", 1))
        self.label = getattr(runner, "label", "job")
        self.runs = 0

    def attach(self, campaign: "Campaign") -> None:
        """The campaign's row in the trial store (once), as :meth:`RunnerEvaluate.attach`."""
        self.campaign = campaign.name
        attach_campaign(self.store, campaign, self.label)

    def __call__(self, point: dict[str, Any]) -> Result:
        from cubic.core.result import RunInterrupted

        job = self.job.model_copy(update={"values": dict(point)})
        fp, fp_hash = _job_fingerprint()
        attempt = 1
        if self.store is not None:
            attempt = self.store.next_attempt(job.job_hash(), job.content_hash(), fp_hash)
        try:
            result = self.runner(point)
        except RunInterrupted as e:
            self._record(job, e.result, attempt, fp, fp_hash)
            raise
        self.runs += 1
        return self._record(job, result, attempt, fp, fp_hash)

    @contextmanager
    def unjudged(self):
        """Runs no pruner may stop: the baseline's, the noise floor's and the confirm step's are
        measurements of a chosen configuration, not candidates (a pruned baseline repeat left a
        campaign with no noise floor and no pairs)."""
        before = getattr(self.runner, "judging", None)
        if before is not None:
            self.runner.judging = False
        try:
            yield
        finally:
            if before is not None:
                self.runner.judging = before

    def _record(self, job, result: Result, attempt: int, fp: dict[str, Any], fp_hash: str) -> Result:
        """The run's Result under the job's keys and this machine's fingerprint, recorded (its
        trial id in ``extra``) when there is a store."""
        result = result.model_copy(update={"workload_hash": job.job_hash(), "config_hash": job.content_hash(),
                                           "fingerprint": result.fingerprint or fp,
                                           "fingerprint_hash": result.fingerprint_hash or fp_hash})
        if self.store is None:
            return result
        tid = self.store.record_job(job, self.label, result, campaign=self.campaign, attempt=attempt)
        return _noted(result, trial_id=tid)


_JOB_FP: list = []


def _job_fingerprint() -> tuple[dict[str, Any], str]:
    """This machine's fingerprint and its hash, for a job's runs (the job picks its own device: the
    GPU's name is part of it where there is one)."""
    if not _JOB_FP:
        import torch

        from cubic.core.fingerprint import fingerprint, fingerprint_hash

        fp = fingerprint("cuda" if torch.cuda.is_available() else "cpu")
        _JOB_FP.append((fp, fingerprint_hash(fp)))
    return _JOB_FP[0]


def job_estimate(groups: dict[str, list[dict[str, float]]], key: str, metric: str,
                 floor: dict[str, Any] | None = None):
    """The one rule for the interval of a user's job's ``metric`` at one point (``groups``: each
    point's successful runs' metrics, ``key`` this point's): its runs pooled by
    cubic.core.stats.estimate with the job's between-repeat noise from the OTHER points with two
    runs or more, else ``floor`` (the job's noise floor), else the ASSUMED floor, labelled so.
    :class:`KeptRepeats` (the campaign's lines) and ``cubic trials show`` (from the store) use it."""
    from cubic.core.stats import estimate, noise_model
    from cubic.core.store import ASSUMED_NOISE_FLOOR

    vals = [m[metric] for m in groups.get(key, []) if metric in m]
    if not vals:
        return None
    noise = noise_model([[m[metric] for m in g if metric in m] for k, g in groups.items() if k != key])
    if noise is not None:
        noise.label = "this job's between-repeat noise on this machine"
    else:
        noise = (floor or {}).get(metric) or ASSUMED_NOISE_FLOOR
    return estimate(vals, noise=noise)


class KeptRepeats:
    """A user's job (``--objective``) as an evaluate that keeps its repeats, so its runs get the
    same intervals and its campaign the same confirm step as cubic's own: each point's successful
    runs (one fresh process each) are pooled by cubic.core.stats.estimate with the job's own
    between-repeat noise on this machine (every point with two runs or more), else the job's noise
    floor (its baseline repeated, :meth:`ensure_noise_floor`), else the ASSUMED floor, labelled so.
    Everything else (``store``, ``attach``, ``runner``) is the wrapped evaluate's."""

    def __init__(self, inner):
        self.inner = inner
        self._reps: dict[str, list[Result]] = {}
        self._floor = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    @staticmethod
    def _key(point: dict[str, Any]) -> str:
        import json

        return json.dumps(point, sort_keys=True, default=str)

    def __call__(self, point: dict[str, Any]) -> Result:
        from cubic.core.stats import ci_names

        out = self.inner(point)
        if not out.ok:
            return out
        self._reps.setdefault(self._key(point), []).append(out)
        from dataclasses import asdict

        metrics, estimates = dict(out.metrics), {}
        for metric, v in out.metrics.items():  # each figure's interval as the confirm step sees it
            if isinstance(v, (int, float)) and not metric.endswith(("_ci_lo", "_ci_hi")) and v > 0:
                e = self.estimate(point, metric)
                lo, hi = ci_names(metric)
                if e is not None and e.hi > e.lo:
                    metrics[lo], metrics[hi] = e.lo, e.hi
                    estimates[metric] = asdict(e)
        n = len(self._reps[self._key(point)])
        return out.model_copy(update={"metrics": metrics, "extra": {**out.extra, "repeats": n,
                                                                    "pooled": {"n_used": n, "estimates": estimates}}})

    def restore(self, since) -> int:
        """The job's successful runs this campaign stored since ``since`` (its creation: a replaced
        campaign of the same name keeps its old runs in the store), back among the kept repeats, so a
        resumed campaign's estimates, noise floor and confirm step see every run made before it stopped
        (they lived only in this process: a resume confirmed a runner-up and left out the best run).
        Returns how many runs it restored."""
        store, name = getattr(self.inner, "store", None), getattr(self.inner, "campaign", None)
        if store is None or name is None or store.get_campaign(name) is None:
            return 0
        job_hash, n = self.inner.job.job_hash(), 0
        for t in store.trials(campaign=name):
            if t.status == "ok" and t.workload_hash == job_hash and (since is None or t.created_at >= since):
                self._reps.setdefault(self._key(dict(t.config.get("values") or {})), []).append(t.result)
                n += 1
        return n

    def add_repeat(self, point: dict[str, Any], n: int = 1) -> Result:
        out = None
        with self._unjudged():
            for _ in range(n):
                out = self(point)
        return out

    def _unjudged(self):
        return getattr(self.inner, "unjudged", nullcontext)()

    def run_value(self, point: dict[str, Any], metric: str) -> float | None:
        runs = self._reps.get(self._key(point))
        return _run_value(runs[-1] if runs else None, metric)

    def contended_value(self, point: dict[str, Any], metric: str) -> float | None:
        runs = self._reps.get(self._key(point))
        return _run_value(runs[-1] if runs else None, metric, contended=True)

    def estimate(self, point: dict[str, Any], metric: str):
        groups = {k: [r.metrics for r in g] for k, g in self._reps.items()}
        return job_estimate(groups, self._key(point), metric, self._floor)

    def ensure_noise_floor(self, point: dict[str, Any], repeats: int = 5) -> str | None:
        """The job's noise floor on this machine: ``point`` (the baseline) run up to ``repeats``
        times in fresh processes, before the campaign."""
        from cubic.core.stats import noise_model

        have = len(self._reps.get(self._key(point), []))
        if not have:
            return None  # the baseline failed: nothing to repeat
        with self._unjudged():
            for _ in range(repeats - have):
                if not self(point).ok:
                    return ("the job's noise floor could not be measured (a repeat failed); intervals use an "
                            "assumed floor")
        runs = self._reps[self._key(point)]
        self._floor = {}
        for metric in runs[0].metrics:
            m = noise_model([[r.metrics[metric] for r in runs if metric in r.metrics]])
            if m is not None:
                m.label = "this job's noise floor on this machine"
                self._floor[metric] = m
        return f"measured the job's noise floor: its baseline run {len(runs)} times in fresh processes"


def _run_value(result: Result | None, metric: str, contended: bool = False) -> float | None:
    """One run's figure for a paired comparison: None for a failed or contended run (contention only
    slows a run, so it would bias its pair) or a missing or non-finite figure; with ``contended``, the
    figure of a run that succeeded contended only."""
    import math

    from cubic.core.stats import contention

    if result is None or not result.ok or bool(contention(result.metrics, result.extra)) != contended:
        return None
    v = result.metrics.get(metric)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None
