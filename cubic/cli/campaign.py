"""``cubic campaign run|resume|work|report|list``: co-design campaigns from the command line.

A campaign's search state lives in an Optuna storage (``--storage``, default
$CUBIC_CAMPAIGNS or sqlite:///./.cubic/campaigns.db); every run's Result lives in the trial store
(``--store``) tagged with the campaign's name. How runs are made (workload, local/simulated/Ray,
steps) is stored with the campaign, so ``resume NAME`` needs nothing else. One process coordinates
a campaign at a time (a lease in the storage): a second ``resume`` names the holder and exits 3;
``work NAME`` adds a worker that runs the coordinator's proposals (and coordinates if it dies).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from cubic.cli.campaign_job import (add_job_flags, check_job_flags, job_build, job_context, job_space,
                                   with_objective)
from cubic.cli.campaign_baseline import (base_config, baseline_cannot_run, baseline_spec, ensure_noise_floor,
                                         measure_baseline, spec_from_context, spec_to_context, stored_baseline)
from cubic.cli.campaign_output import finish
from cubic.cli.common import default_storage, int_at_most
from cubic.core.runspec import RunSpec
from search.strategy_names import BASELINES, STRATEGIES
from cubic.core.spec import (MAX_BUDGET, MAX_CONFIRM_REPEATS, MAX_REPEATS, MAX_STEPS, MAX_THREADS, MAX_WORLD_SIZE,
                              SpecError)

DATA = Path(__file__).resolve().parent.parent / "data"
DEFAULT_SPACES = {"local": DATA / "space-default.yaml", "distributed": DATA / "space-sharding-cpu.yaml",
                  "simulated": DATA / "space-sim-default.yaml"}
# what each kind of runner puts in Result.metrics (cubic.runners.local/_child, distributed, sim),
# plus wall_time_s which RunnerEvaluate adds: an objective or constraint on anything else can never
# be evaluated there (every run would be "ok" and none feasible: best nan at None)
REPORTED_METRICS = {
    "local": {"examples_per_s", "step_time_median_ms", "step_time_p90_ms", "peak_mem_bytes", "loss_start",
              "loss_end", "ne_start", "ne_end", "train_loss_first", "train_loss_last", "batch_size",
              "ne_at_budget", "loss_at_budget", "examples_budget"},
    "distributed": {"examples_per_s", "step_time_median_ms", "step_time_p90_ms", "peak_mem_bytes",
                    "comm_time_median_ms", "loss_start", "loss_end", "ne_start", "ne_end", "train_loss_first",
                    "train_loss_last", "batch_size"},
    "simulated": {"examples_per_s", "examples_per_s_per_gpu", "step_time_median_ms", "step_time_p90_ms",
                  "peak_mem_bytes", "ne_cost_rel", "ne_cost_rel_ci_hi"},
}


def check_space_fits_runner(space, kind: str, source: str) -> None:
    """One line (SpecError: exit 2) before anything starts when the space's objectives or
    constraints name a metric this kind of runner never reports."""
    reported = REPORTED_METRICS[kind] | {"wall_time_s"}
    for what, items in (("objective", space.objectives), ("constraint", space.constraints)):
        for i, item in enumerate(items):
            if item.metric not in reported:
                label = getattr(item, "name", None) or item.metric
                raise SpecError(f"{what} {label!r} on metric {item.metric!r} cannot apply to a {kind} runner, which "
                                f"reports {', '.join(sorted(reported))}; use a space for this runner (default: "
                                f"{DEFAULT_SPACES[kind].relative_to(DATA.parent.parent)})",
                                source=source, field=f"{what}s[{i}]")


def check_space_values(space, workload, kind: str, source: str) -> None:
    """One line (SpecError: exit 2) before anything starts when a value the space can propose makes
    a config no run can use (a batch of 0, a key that is no Config field, an unknown planner, a knob
    the architecture refuses): otherwise every proposal of it would be a recorded failed run. Each
    choice (or end of its grid) is tried with the values that enable it and a first value of each
    parameter it enables (``when``); the others keep the base config's."""
    from cubic.runners.base import check_config_values
    from search.space import load_space

    base = base_config(kind)
    names = [p.name for p in load_space(source).parameters]  # the file's indexes (for_workload drops some)
    by_name = {p.name: p for p in space.parameters}

    def enabling(p) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for parent, values in (p.when or {}).items():
            out.update({**enabling(by_name[parent]), parent: values[0]})
        return out

    for p in space.parameters:
        where = f"parameters.{names.index(p.name)}"
        last = p.high if p.type == "categorical" or p.count() is None else p.low + (p.count() - 1) * (p.step or 1)
        for v in p.choices if p.type == "categorical" else (p.low, last):  # the grid's ends
            v = int(v) if p.type == "int" else v
            point = {**enabling(p), p.name: v}
            for q in space.parameters:  # what the value enables is set too (a policy needs its budget)
                if q.when and q.name not in point and space.active(q, point):
                    point[q.name] = q.choices[0] if q.type == "categorical" else (int(q.low) if q.type == "int" else q.low)
            try:
                config = space.to_config(point, base)
                config.apply(workload)
                check_config_values(config)
            except SpecError as e:
                reason = str(e)[len(e.source) + 2:] if e.source and str(e).startswith(f"{e.source}: ") else str(e)
                raise SpecError(f"{p.name} = {v!r} makes a config no run can use ({reason})",
                                source=source, field=where) from None


def _groups_that_fit(space, ranks: int, source: str, default: bool):
    """The space's 2D group sizes against the run's world: cubic's own default space keeps the ones that
    divide it (with the note to print; an audit saw 6 of 8 simulated runs on h100x8 fail 'a group of 16 ranks must
    divide the world size 8'); a user's space that offers one that cannot is refused, naming it."""
    from cubic.core.spec import group_misfit
    from search.space import load_space

    p = next((q for q in space.parameters if q.name == "sharding.group_size" and q.type == "categorical"), None)
    bad = [v for v in (p.choices if p else []) if group_misfit(int(v), ranks)]
    if not bad:
        return space, None
    if not default:
        where = f"parameters.{[q.name for q in load_space(source).parameters].index(p.name)}"
        raise SpecError(f"sharding.group_size = {bad[0]!r}: {group_misfit(int(bad[0]), ranks)} (the run's "
                        f"{ranks} ranks)", source=source, field=where)
    keep = [v for v in p.choices if v not in bad]
    params = [q.model_copy(update={"choices": keep}) if q is p else q for q in space.parameters if q is not p or keep]
    return space.model_copy(update={"parameters": params}), (
        f"the default space's sharding.group_size keeps {keep or 'none'} of {p.choices}: a group must divide the "
        f"run's {ranks} ranks")


def _runner_from_context(ctx: dict[str, Any]):
    """The Runner a campaign's stored context describes (local child process, simulated, Ray)."""
    r = RunSpec.from_context(ctx)
    if r.kind == "simulated":
        from cubic.runners.sim import SimulatedRunner

        inner = SimulatedRunner.from_spec(r.simulate)
    elif r.kind == "distributed":
        from cubic.runners.distributed import DistributedRunner

        # sharded configs on W local processes (torch.distributed, gloo): real all-to-alls
        inner = DistributedRunner(r.world_size, timeout_s=r.timeout, verify=False)
    else:
        from cubic.cli.common import local_runner

        inner = local_runner(r.timeout, r.device, r.threads)
    if r.ray:
        from cubic.runners.ray_runner import RayRunner

        return RayRunner(inner, address=r.ray_address, num_cpus=r.cpus_per_trial, num_gpus=r.gpus_per_trial)
    return inner


def _build(name: str, meta_context: dict[str, Any], space, store_url: str | None):
    from cubic.codesign.evaluate import RunnerEvaluate
    from cubic.codesign.prior import cubic_featurizer

    if meta_context.get("job"):  # a user's own job (see "a user's own job" below)
        return job_build(name, meta_context, space, store_url), None
    from cubic.core.store import TrialStore
    from cubic.core.workloads import load_workload

    workload = load_workload(meta_context["workload"])
    runner = _runner_from_context(meta_context)
    from cubic.cli.common import import_pending

    store = import_pending(TrialStore(store_url, origin="--store") if store_url else TrialStore())
    r = RunSpec.from_context(meta_context)
    evaluate = RunnerEvaluate(workload, runner, space, steps=r.steps, warmup=r.warmup, store=store, campaign=name,
                              repeats=r.repeats, remeasure=r.remeasure, base_config=base_config(r.kind))
    if r.kind == "local":  # NE and loss also at the campaign's equal training budget (examples seen)
        from cubic.codesign.evaluate import equal_budget

        evaluate.budget_examples = equal_budget(space, workload, r.steps, r.warmup)
    return evaluate, cubic_featurizer(space)


def _at_equal_budget(space, kind: str):
    """The space with its COMPARATIVE NE constraint -- shape tuning's NE ceiling, relative to the
    default config's NE -- read at the campaign's equal training budget
    (cubic.codesign.evaluate.AT_BUDGET: ne_end -> ne_at_budget) for local runs, whose trajectory
    gives NE at any number of examples seen: a larger batch does not pass the ceiling by having seen
    more examples in the same steps. An absolute sanity floor ("minimum quality": did training go
    wrong) stays on the run's own end NE: at a short campaign's equal budget (e.g. 4 steps of batch
    256) every config is still near its initial NE, and such a floor would reject them all."""
    from cubic.codesign.evaluate import AT_BUDGET
    from search.space import NE_CEILING_NAME

    if kind != "local" or not any(c.metric in AT_BUDGET and c.name.startswith(NE_CEILING_NAME)
                                  for c in space.constraints):
        return space
    cons = [c.model_copy(update={"metric": AT_BUDGET[c.metric]})
            if c.metric in AT_BUDGET and c.name.startswith(NE_CEILING_NAME) else c for c in space.constraints]
    return space.model_copy(update={"constraints": cons})


def _note_budget(space, workload, steps: int, warmup: int) -> None:
    """Before the runs: say so when the space's largest batch makes less than one update within the
    equal budget NE is compared at (the answer says it again for the winner)."""
    from cubic.codesign.evaluate import batch_sizes, equal_budget, one_update_caveat

    caveat = one_update_caveat(equal_budget(space, workload, steps, warmup), batch_sizes(space, workload)[1],
                               steps, warmup, "the space's largest batch")
    if caveat:
        print(f"cubic: note: {caveat}", file=sys.stderr)


def cmd_run(args: argparse.Namespace) -> int:
    from cubic.core.workloads import load_workload

    check_job_flags(args)
    kind = "simulated" if args.simulate else ("distributed" if args.world_size > 1 else "local")
    workload = load_workload(args.workload) if not args.objective else None
    if workload is not None:
        from cubic.cli.common import check_topology_refs

        check_topology_refs(workload.topology, args.workload)
    space_path = str(args.space or DEFAULT_SPACES[kind])
    space = job_space(args) if args.objective else _workload_space(args, space_path, workload, kind)
    space = with_objective(space, args.metric, args.direction)
    group_note = None
    if not args.objective:  # a job's metrics are whatever its command prints
        try:
            check_space_fits_runner(space, kind, space_path)
        except SpecError as e:  # the objective the user typed, named as typed (not as the space's)
            if args.metric and (e.field or "").startswith("objectives[0]"):
                raise SpecError(e.message, field="--metric") from None
            raise
        check_space_values(space, workload, kind, space_path)
        space, group_note = _groups_that_fit(space, RunSpec(kind=kind, simulate=args.simulate,
                                                            world_size=args.world_size).ranks,
                                             space_path, default=args.space is None)
        space = _at_equal_budget(space, kind)
        if kind == "local":
            _note_budget(space, workload, args.steps, args.warmup)
    baseline = None if args.no_baseline else baseline_spec(args, space, workload)
    _check_where_runs_happen(args, kind)
    # the one typed record of where runs happen; stored in the campaign's context as plain JSON
    runner_ctx = RunSpec(kind=kind, simulate=args.simulate, world_size=args.world_size, steps=args.steps,
                         warmup=args.warmup, timeout=args.timeout, device=args.device, threads=args.threads,
                         repeats=args.repeats, remeasure=args.remeasure, confirm_repeats=args.confirm_repeats,
                         ray=bool(args.ray or args.ray_address), ray_address=args.ray_address,
                         cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial
                         ).model_dump(mode="json")
    from cubic.core.store import redact_url

    # the campaign's settings are readable by anyone who can read its storage: never the password
    context = {"workload": args.workload, "runner": runner_ctx, "store": redact_url(args.store) or None}
    if args.objective:
        context = job_context(args, space)
    # what `campaign resume` measures when the run stopped before its baseline did (None: --no-baseline)
    context["baseline"] = spec_to_context(baseline)
    context["baselines"] = bool(args.baselines)  # resume runs or resumes them too
    storage = args.storage or default_storage()
    from cubic.core.store import check_url

    # before the trial store is opened: a mistyped storage URL left an empty .cubic/trials.db behind
    check_url(storage, "--storage" if args.storage else "CUBIC_CAMPAIGNS")
    _check_warm_start(storage, args.warm_start or ())
    if group_note:  # after the last check: bad input stays one line
        print(f"cubic: note: {group_note}", file=sys.stderr)
    if args.strategy == "prior-order" and not walks_prior(context, space):
        raise SpecError("prior-order walks the step model's order, and these runs have none (it models one CPU "
                        "process, W gloo processes on this CPU, or a simulated cluster, over a discrete space)",
                        field="--strategy")
    names = [(args.name, args.strategy)] + [(f"{args.name}-{b}", b)
                                            for b in (baselines_for(context, space) if args.baselines else ())]
    if not args.objective and space.shape_knobs:  # the model's shape changes: bound its quality
        ne = _reference_ne(context, space, args.store, kind)
        if ne is None:
            return 1
        space = _at_equal_budget(space.with_ne_ceiling(ne), kind)
        print(f"cubic: tuning the model's shape ({', '.join(space.shape_knobs)}) under the {space.constraints[-1].name}: "
              f"NE <= {space.constraints[-1].max:.4f}", file=sys.stderr)
    if args.replace:  # its old --baselines siblings too: a report would plot them against the new campaign
        _replace_studies(storage, [args.name] + [f"{args.name}-{b}" for b in BASELINES])
    summaries = _run_campaigns(args, names, space, context, storage, baseline)
    if summaries is None:
        return 1
    return finish(args, summaries, storage, space, baselines=[n for n, _ in names[1:]])


def walks_prior(context: dict[str, Any], space) -> bool:
    """Whether ``prior-order`` can run here: a step model for these runs, over a small discrete space."""
    from cubic.codesign.prior import StepModelPrior
    from search.prior_order import orderable

    return bool(context.get("workload")) and StepModelPrior.available(context) and orderable(space)


def baselines_for(context: dict[str, Any], space) -> tuple[str, ...]:
    """The --baselines a campaign runs beside it: walking the step model's order only where there is one."""
    return tuple(b for b in BASELINES if b != "prior-order" or walks_prior(context, space))


def _check_where_runs_happen(args: argparse.Namespace, kind: str) -> None:
    """What can be known about the runs' machine before the first run (a flag the user typed, exit 2)."""
    if args.world_size > 1 and args.simulate:
        raise SpecError("--world-size is for local multi-process runs; a simulated cluster has its own size",
                        field="--world-size")
    if kind == "local" and not (args.ray or args.ray_address):
        from cubic.cli.common import check_local_device

        check_local_device(args.device)
    if args.ray_address:
        from cubic.cli.common import runner_part

        runner_part("cubic.runners.ray_runner", "check_address", "Ray", "--ray-address")(args.ray_address)


def _check_warm_start(storage: str, priors) -> None:
    """Known now, not after the baseline has run and been stored."""
    from cubic.core.store import redact_url

    for prior in priors:
        from cubic.codesign.storage import load_meta

        try:
            load_meta(storage, prior)
        except SpecError:
            raise SpecError(f"no campaign {prior!r} in {redact_url(storage)} to warm-start from",
                            field="--warm-start") from None


def _replace_studies(storage: str, names: list[str]) -> None:
    """The search state goes; its runs stay in the trial store (and serve repeats)."""
    import optuna

    from cubic.codesign.storage import open_storage

    st = open_storage(storage)
    existing = {s.study_name for s in optuna.get_all_study_summaries(st)}
    for name in names:
        if name in existing:
            optuna.delete_study(study_name=name, storage=st)


def _run_campaigns(args, names, space, context, storage, baseline):
    """The campaign and its --baselines, one after the other; None when the baseline cannot run."""
    from cubic.codesign.campaign import Campaign

    summaries = []
    for name, strategy in names:
        ctx = context if name == args.name else _sibling_context(context)
        evaluate, featurize = _build(name, ctx, space, args.store)
        c = Campaign(space, evaluate, name=name, strategy=strategy, budget=args.budget, batch_size=args.batch,
                     seed=args.seed, storage=storage, patience=args.patience, max_retries=args.retries,
                     workers=args.workers, featurize=featurize, context=ctx,
                     warm_start=args.warm_start or (), listener=_listener(space))
        evaluate.attach(c)
        base_pair = None
        with _interrupted_marks(evaluate.store, name, c.study):
            if baseline is not None and name == args.name:
                base_pair = measure_baseline(c, evaluate, space, baseline)
                if baseline_cannot_run(base_pair[3]):
                    _free_name(c, evaluate.store)
                    return None
                ensure_noise_floor(base_pair)
            s = c.run()
            # every kind of campaign is confirmed by the same rule (a job's evaluate keeps its repeats)
            s.confirm = c.confirm(args.confirm_repeats, baseline=base_pair[:2] if base_pair and base_pair[2] else None)
        if evaluate.store is not None:
            evaluate.store.set_campaign_status(name, "finished")
        summaries.append(s)
        if space.shape_knobs and not args.json:
            _print_ne_per_run(c, space)
    return summaries


def _sibling_context(context: dict[str, Any]) -> dict[str, Any]:
    """A --baselines sibling's context: no baseline of its own (an uninterrupted run measures none for it;
    a resumed sibling measured one, its noise floor and pairs), no siblings."""
    return {**context, "baseline": None, "baselines": False}


def _resume_siblings(args: argparse.Namespace, ctx: dict[str, Any], storage: str, space, confirm: int) -> list:
    """The --baselines siblings of a resumed campaign, resumed or (never started) run to the same budget:
    `campaign resume` ran only the campaign itself, and its report said "against the baselines" with none."""
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import list_campaigns, load_meta

    if not ctx.get("baselines"):
        return []
    meta, have = load_meta(storage, args.name), {r["name"]: r for r in list_campaigns(storage)}
    out = []
    for b in baselines_for(ctx, space):
        name, sib = f"{args.name}-{b}", _sibling_context(ctx)
        row = have.get(name)
        if row and row["status"] == "finished" and row["runs"] >= meta["budget"]:
            continue  # done: resuming it would only repeat its confirm step
        evaluate, featurize = _build(name, sib, space, args.store or ctx.get("store"))
        if name in have:
            c = Campaign.resume(name, evaluate, storage=storage, featurize=featurize, listener=_listener(space),
                                budget=args.budget)
        else:
            c = Campaign(space, evaluate, name=name, strategy=b, budget=args.budget or meta["budget"],
                         batch_size=meta["batch_size"], seed=meta["seed"], storage=storage, patience=meta["patience"],
                         max_retries=meta["max_retries"], featurize=featurize, context=sib, listener=_listener(space))
        evaluate.attach(c)
        with _interrupted_marks(evaluate.store, name, c.study):
            s = c.run()
            s.confirm = c.confirm(confirm, baseline=None)
        if evaluate.store is not None:
            evaluate.store.set_campaign_status(name, "finished")
        out.append(s)
    return out


def _free_name(c, store) -> None:
    """A campaign whose baseline could not run ran nothing else: its study goes, so that "fix the job and
    run again" works under the same name (it said "a campaign of this name exists"); the baseline's run
    stays in the trial store, as every run does."""
    import optuna

    optuna.delete_study(study_name=c.name, storage=c.storage)
    if store is not None:
        store.set_campaign_status(c.name, "failed")


def _listener(space):
    """Live progress (one line per finished run on stderr; a bar under them on a terminal)."""
    from cubic.codesign.progress import ProgressLines

    return ProgressLines(space)


def _workload_space(args: argparse.Namespace, space_path: str, workload, kind: str):
    """The space for a cubic workload: the architecture's parameters, shape knobs (model.*) only
    when asked (--tune-shape or shape: true), with --ne-ceiling-pct applied."""
    from search.space import load_space

    full = load_space(space_path)
    update: dict[str, Any] = {}
    if args.tune_shape:
        update["shape"] = True
    if args.ne_ceiling_pct is not None:
        update["ne_ceiling_pct"] = args.ne_ceiling_pct
    full = full.model_copy(update=update) if update else full
    space = full.for_workload(workload)
    left_out = [p.name for p in full.for_workload(workload, shape=True).parameters if p.name not in space.param_names]
    if left_out:
        print(f"cubic: the model's shape is kept: {', '.join(left_out)} not tuned (--tune-shape tunes them under "
              "an NE ceiling)", file=sys.stderr)
    if args.tune_shape and not space.shape_knobs:
        raise SpecError(f"the space has no shape knob (model.*) for {workload.name}'s {workload.dense_arch.kind} "
                        "architecture: nothing to tune", source=space_path, field="--tune-shape")
    # the NE ceiling compares configs at an equal training budget (_at_equal_budget): only a runner
    # whose trajectory gives NE at any number of examples seen can judge it
    if space.shape_knobs and "ne_at_budget" not in REPORTED_METRICS[kind]:
        raise SpecError(f"tuning the model's shape needs a runner that measures NE at an equal training budget; a "
                        f"{kind} runner does not (use local runs, or leave the shape alone)",
                        field="--tune-shape" if args.tune_shape else "shape")
    return space


def _reference_ne(context: dict[str, Any], space, store_url: str | None, kind: str) -> float | None:
    """NE of the default config (the workload's own shape), measured (or served from the trial
    store) before the campaign: what the NE ceiling of shape tuning is relative to."""
    from cubic.codesign.evaluate import RunnerEvaluate

    evaluate, _ = _build("", context, space, store_url)
    ref = RunnerEvaluate(evaluate.workload, evaluate.runner, space, steps=evaluate.steps, warmup=evaluate.warmup,
                         store=evaluate.store, campaign=None, base_config=base_config(kind),
                         repeats=evaluate.repeats)
    ref.budget_examples = evaluate.budget_examples  # the ceiling is on NE at the equal budget too
    ev = ref({})
    ne = ev.metrics.get("ne_at_budget", ev.metrics.get("ne_end"))
    if not ev.ok or not isinstance(ne, (int, float)):
        print(f"cubic: the default config's run, whose NE bounds shape tuning, failed ({ev.failure_kind}: "
              f"{ev.reason}); no campaign started", file=sys.stderr)
        return None
    return float(ne)


def _print_ne_per_run(c, space) -> None:
    """Shape tuning: each run's NE next to the ceiling (a run above it cannot win)."""
    from cubic.cli.common import stdout_console
    from cubic.codesign.answer import fmt

    ceiling = next(x for x in space.constraints if x.name.startswith("NE ceiling"))
    con = stdout_console()
    con.print(f"{c.name}: NE per run ({ceiling.name}: NE <= {ceiling.max:.4f})")
    for o in c.observations():
        ne = o.metrics.get(ceiling.metric, o.metrics.get("ne_end"))
        flag = "" if not o.ok else (" over the NE ceiling: not eligible" if ne is not None and ne > ceiling.max else "")
        shown = "failed: " + str(o.failure_kind) if not o.ok else f"NE {ne:.4f}" if ne is not None else "NE -"
        con.print(f"  {shown}, {space.primary.metric} {fmt(o.metrics.get(space.primary.metric))}{flag} at {o.point}")


def _stored(args: argparse.Namespace, overrides: dict[str, Any], progress: bool = True):
    """(campaign, evaluate) for a stored campaign, from its stored settings."""
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import load_meta

    storage = args.storage or default_storage()
    meta = load_meta(storage, args.name)
    from search.space import Space

    space = Space.model_validate(meta["space"])
    ctx = meta.get("context", {})
    stored = ctx.get("store")
    if not args.store and stored and "***" in stored:
        if os.environ.get("CUBIC_STORE"):
            stored = None  # TrialStore() reads $CUBIC_STORE
        else:
            raise SpecError("this campaign's trial store needs a password, which is never stored: pass --store URL "
                            "(or set it in $CUBIC_STORE)", field="--store")
    evaluate, featurize = _build(args.name, ctx, space, args.store or stored)
    listener = _listener(space) if progress else None
    try:
        c = Campaign.resume(args.name, evaluate, storage=storage, featurize=featurize, listener=listener, **overrides)
    except SpecError as e:  # named as the flag typed
        if e.field == "budget":
            raise SpecError(e.message, field="--budget") from None
        raise
    evaluate.attach(c)
    if callable(getattr(evaluate, "restore", None)):  # a job's repeats made before the stop
        from datetime import datetime, timezone

        made = meta.get("created_at")
        since = datetime.strptime(made, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc) if made else None
        evaluate.restore(since)
    return c, evaluate, ctx, space


@contextmanager
def _interrupted_marks(store, name: str, study=None) -> Iterator[None]:
    """Ctrl-C: the trial store's campaign row says ``interrupted`` too (the Optuna study's status is
    set by Campaign's run, and here when the stop came before it: during the baseline or its noise
    floor, where it stayed ``created``), so neither lists it as running or never started."""
    try:
        yield
    except KeyboardInterrupt:
        try:
            if store is not None:
                store.set_campaign_status(name, "interrupted")
            if study is not None and study.user_attrs.get("status") == "created":
                study.set_user_attr("status", "interrupted")
        except Exception:  # noqa: BLE001 - the interrupt goes on whatever the store does
            pass
        raise


def _lease_held(e) -> int:
    print(f"cubic: {e}", file=sys.stderr)
    return 3


def cmd_resume(args: argparse.Namespace) -> int:
    from cubic.codesign.campaign import BASELINE_KEY
    from cubic.codesign.storage import LeaseHeld

    storage = args.storage or default_storage()
    c, evaluate, ctx, space = _stored(args, dict(budget=args.budget), progress=True)
    if callable(getattr(c.listener, "seen", None)):
        c.listener.seen(c.study.get_trials(deepcopy=False))
    spec = spec_from_context(ctx)
    try:
        with _interrupted_marks(evaluate.store, args.name, c.study):
            if spec is not None and not c.study.user_attrs.get(BASELINE_KEY):  # stopped before its baseline ran
                if baseline_cannot_run(measure_baseline(c, evaluate, space, spec)[3]):
                    return 1
            base = stored_baseline(c, evaluate, space)
            if base is not None:  # the noise floor: from the runs before the stop, finished where it was cut short
                ensure_noise_floor((*base, True))
            s = c.run()
    except LeaseHeld as e:  # another process drives this campaign: say who, run nothing
        return _lease_held(e)
    confirm = (args.confirm_repeats if args.confirm_repeats is not None
               else RunSpec.from_context(ctx).confirm_repeats or 0)
    if evaluate.store is not None:
        s.confirm = c.confirm(confirm, baseline=base)
        evaluate.store.set_campaign_status(args.name, "finished")
    return finish(args, [s, *_resume_siblings(args, ctx, storage, space, confirm)], storage, space, baselines=None)


def cmd_work(args: argparse.Namespace) -> int:
    from cubic.codesign.storage import DB_WAIT_S, through_outages
    from cubic.codesign.worker import OutageLog

    outage = OutageLog("cubic")  # the database restarted under this worker: it waited, it goes on
    wait_s = DB_WAIT_S if args.db_wait is None else args.db_wait
    rep = through_outages(lambda: _stored(args, dict(workers=args.workers))[0], lambda c: c.work(),
                          [args.storage or default_storage(), args.store], wait_s=wait_s, on_outage=outage)
    print(f"worker {rep.worker}: {rep.runs} runs ({rep.served} served from the trial store)"
          + ("; coordinated" if rep.coordinated else "") + outage.suffix())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from cubic.codesign.report import write_report

    storage = args.storage or default_storage()
    path = write_report(args.name, storage=storage, out_dir=Path(args.out), baselines=args.baseline or None,
                        store_url=args.store)
    print(path)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from cubic.codesign.storage import list_campaigns

    rows = list_campaigns(args.storage or default_storage())
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:  # as `trials list` says it: an empty table reads like a broken one
        from cubic.core.store import redact_url

        print(f"no campaigns stored yet in {redact_url(args.storage or default_storage())}")
        return 0
    from cubic.cli.common import print_table

    cols = ("name", "workload", "strategy", "runs", "budget", "status", "stop_reason", "created_at")
    print_table("campaigns", list(cols), [[str(r.get(c, "")) for c in cols] for r in rows])
    return 0


# the trial store keeps a campaign's name in 200 characters (Optuna allows 512), and the baselines
# run as NAME-random and NAME-tpe
MAX_NAME = 200 - len("-random")
MAX_WORKERS = 1024  # threads in one process: more is a typo (each runs points until none is left)


def _campaign_name(text: str) -> str:
    from cubic.core.spec import sanitize

    if not text.strip():
        raise argparse.ArgumentTypeError("a campaign name cannot be empty")
    if len(text) > MAX_NAME:
        raise argparse.ArgumentTypeError(f"at most {MAX_NAME} characters, got {len(text)}")
    if sanitize(text) != text:
        raise argparse.ArgumentTypeError(f"control characters in {sanitize(text)!r}")
    return text


def register(sub: Any) -> None:
    p = sub.add_parser("campaign", help="proxy-guided co-design search campaigns (CubicML)",
                       description="Search a co-design space for the highest throughput that fits memory and "
                                   "keeps quality: a learned proxy proposes, real runs validate, the proxy "
                                   "retrains. Campaigns are stored and resumable.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    # the order here is the order of the verbs in `cubic campaign --help`
    _add_run(verbs)
    _add_resume(verbs)
    _add_work(verbs)
    _add_report(verbs)
    _add_list(verbs)
    from cubic.cli.dashboard import add_dashboard

    add_dashboard(verbs, _add_common)


def _add_common(q: Any) -> None:
    """--storage and --json, which every verb takes."""
    q.add_argument("--storage", metavar="URL", help="Optuna storage of campaigns (default $CUBIC_CAMPAIGNS or "
                                                     "sqlite:///./.cubic/campaigns.db; a PostgreSQL URL shares "
                                                     "one campaign between machines)")
    q.add_argument("--json", action="store_true", help="machine-readable output")


def _add_run(verbs: Any) -> None:
    from cubic.cli.common import (add_store_argument, nonnegative_float, nonnegative_int, positive_float,
                                  positive_int)

    run = verbs.add_parser("run", help="start a campaign", description="Start a new campaign and run it to its "
                           "budget or a plateau; optionally also the random and direct-TPE baselines, and a report.")
    run.add_argument("--workload", metavar="NAME|FILE", help="a cubic workload to co-design (or --objective)")
    run.add_argument("--space", metavar="FILE", help="space YAML (default by runner: cubic/data/space-default.yaml "
                                                     "locally, space-sim-default.yaml with --simulate, "
                                                     "space-sharding-cpu.yaml with --world-size > 1)")
    run.add_argument("--name", required=True, type=_campaign_name, help="campaign name (unique in the storage)")
    run.add_argument("--strategy", choices=STRATEGIES, default="cubic",
                     help="cubic (proxy + Optuna TPE, default), cubic-gp, cubic-nsga2; baselines: tpe, gp, random")
    run.add_argument("--budget", type=int_at_most(MAX_BUDGET), default=12, help="real runs (default 12)")
    run.add_argument("--batch", type=int_at_most(MAX_BUDGET), default=4,
                     help="proposals validated per round (default 4)")
    run.add_argument("--seed", type=nonnegative_int, default=0)
    run.add_argument("--patience", type=positive_int, default=None, help="stop after N rounds without improvement")
    run.add_argument("--retries", type=nonnegative_int, default=2, help="retries of a transient failure (default 2)")
    run.add_argument("--workers", type=int_at_most(MAX_WORKERS), default=1, help="runs in parallel (default 1)")
    run.add_argument("--steps", type=int_at_most(MAX_STEPS), default=20, help="timed steps per run (default 20)")
    run.add_argument("--warmup", type=int_at_most(MAX_STEPS, low=0), default=3,
                     help="warm-up steps per run (default 3)")
    run.add_argument("--timeout", type=positive_float, default=300.0, metavar="S", help="per run (default 300)")
    run.add_argument("--device", default="auto")
    run.add_argument("--world-size", type=int_at_most(MAX_WORLD_SIZE), default=1,
                     help="local processes per run (default 1); > 1 runs sharded configs with torch.distributed "
                          "(gloo), e.g. with the space cubic/data/space-sharding-cpu.yaml")
    run.add_argument("--threads", type=int_at_most(MAX_THREADS), default=1,
                     help="intra-op threads per local run (default 1: on a shared machine one thread per run "
                          "is faster and far less noisy than several)")
    run.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=1, metavar="R",
                     help="repeats per evaluated config, each a fresh process (default 1); the proxy trains on their "
                          "pooled median, every repeat is stored")
    run.add_argument("--remeasure", action="store_true",
                     help="run R fresh repeats of every config even when the trial store holds it (pooled with "
                          "the stored ones)")
    from cubic.codesign.confirm import SPEEDUP_PAIRS

    run.add_argument("--confirm-repeats", type=int_at_most(MAX_CONFIRM_REPEATS, low=0), default=4, metavar="N",
                     help="at the end, up to N extra repeats of the two leading configs until the winner's 95%% "
                          f"interval separates from the runner-up's, then {SPEEDUP_PAIRS} back-to-back rounds of the "
                          "baseline, the winner and the step model's pick for the speedup and the line against the "
                          "pick (default 4; 0: neither, both UNPAIRED)")
    run.add_argument("--simulate", metavar="CLUSTERxN", help="runs on the simulated cluster, e.g. h100x64, or a cluster file "
                     "(docs/clusters.md) (SIMULATED)")
    run.add_argument("--ray", action="store_true", help="validate runs as Ray tasks on a local Ray instance")
    run.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (implies --ray)")
    run.add_argument("--cpus-per-trial", type=positive_float, default=1.0)
    run.add_argument("--gpus-per-trial", type=nonnegative_float, default=0.0)
    run.add_argument("--warm-start", nargs="+", metavar="CAMPAIGN", help="learn from these campaigns' trials too")
    run.add_argument("--baselines", action="store_true",
                     help="also run the baselines as NAME-random, NAME-tpe and, where the runs have a step "
                          "model, NAME-prior-order (its order walked, best predicted first)")
    run.add_argument("--report", metavar="DIR", help="write the HTML report here when done")
    run.add_argument("--tune-shape", action="store_true",
                     help="also tune the model's shape (the space's model.* knobs: layers, widths, dims); off by "
                          "default (the space may say shape: true); the winner's NE must stay within "
                          "--ne-ceiling-pct of the default config's NE, measured first")
    run.add_argument("--ne-ceiling-pct", type=positive_float, default=None, metavar="PCT",
                     help="with shape tuning: NE may exceed the default config's NE by at most PCT percent "
                          "(default: the space's ne_ceiling_pct, 0.1)")
    run.add_argument("--replace", action="store_true",
                     help="start afresh if a campaign of this name exists (its runs stay in the trial store)")
    add_job_flags(run)
    add_store_argument(run)
    _add_common(run)
    run.set_defaults(func=cmd_run)


def _add_resume(verbs: Any) -> None:
    from cubic.cli.common import add_store_argument

    res = verbs.add_parser("resume", help="continue a stopped or killed campaign",
                           description="Continue a campaign from its stored state; no finished run is run again.")
    res.add_argument("name", type=_campaign_name)
    res.add_argument("--budget", type=int_at_most(MAX_BUDGET), help="a new total budget")
    res.add_argument("--confirm-repeats", type=int_at_most(MAX_CONFIRM_REPEATS, low=0), default=None, metavar="N",
                     help="extra repeats of the confirm phase (default: as the campaign was started)")
    res.add_argument("--report", metavar="DIR")
    add_store_argument(res)
    _add_common(res)
    res.set_defaults(func=cmd_resume)


def _add_work(verbs: Any) -> None:
    from cubic.cli.common import add_store_argument, nonnegative_float

    wk = verbs.add_parser("work", help="add a worker to a campaign (several processes or machines on one storage)",
                          description="Run the points the campaign's coordinator proposes, with its stored "
                                      "settings; coordinate when no one else does; exit when it is finished.")
    wk.add_argument("name")
    wk.add_argument("--workers", type=int_at_most(MAX_WORKERS), default=1,
                    help="runs in parallel in this process (default 1)")
    wk.add_argument("--db-wait", type=nonnegative_float, default=None, metavar="S",
                    help="after a database outage (a restart), wait this long for it to answer and go on "
                         "(default cubic.codesign.storage.DB_WAIT_S, 300; 0: stop at once)")
    add_store_argument(wk)
    _add_common(wk)
    wk.set_defaults(func=cmd_work)


def _add_report(verbs: Any) -> None:
    from cubic.cli.common import add_store_argument

    rep = verbs.add_parser("report", help="write a campaign's HTML report (one self-contained page, interactive "
                           "plotly figures) and the winning job config")
    rep.add_argument("name", type=_campaign_name)
    rep.add_argument("--out", required=True, metavar="DIR")
    rep.add_argument("--baseline", nargs="+", metavar="CAMPAIGN",
                     help="campaigns to compare against (default: NAME-random, NAME-tpe when present)")
    add_store_argument(rep)
    _add_common(rep)
    rep.set_defaults(func=cmd_report)


def _add_list(verbs: Any) -> None:
    ls = verbs.add_parser("list", help="stored campaigns")
    _add_common(ls)
    ls.set_defaults(func=cmd_list)


# ---- baselines for the answer ---------------------------------------------------------------
