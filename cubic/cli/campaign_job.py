"""A user's own job as a campaign's objective (``cubic campaign run --objective``): its flags, their
checks, its space and primary metric, the pruner over its intermediate lines, and the runner and
evaluate that run it (cubic.runners.command, cubic.codesign.evaluate.JobEvaluate)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cubic.core.spec import SpecError


def add_job_flags(run: Any) -> None:
    from cubic.cli.common import positive_int

    g = run.add_argument_group("your own job", "tune any command: `--objective 'python train.py --lr {lr}' "
                               "--space my.yaml` (placeholders are the space's parameters, {out} a metrics file, "
                               "{nproc} processes); the job prints its metrics as a JSON line")
    g.add_argument("--objective", metavar="CMD", help="the job's command line with {parameter} placeholders "
                   "(instead of --workload); run without a shell, once per proposal, under --timeout")
    g.add_argument("--launcher", metavar="CMD", help="prepended to --objective for multi-process jobs, "
                   "e.g. 'torchrun --standalone --nproc-per-node {nproc}'")
    g.add_argument("--nproc", type=positive_int, default=1, help="{nproc} of --launcher (default 1; a space "
                   "parameter named nproc overrides it)")
    g.add_argument("--metric", type=_metric_name, help="the metric to optimize (default: the space's first objective)")
    g.add_argument("--direction", choices=("maximize", "minimize"),
                   help="of --metric (default: the space's, else maximize)")
    g.add_argument("--prune", choices=tuple(PRUNERS), default="none",
                   help="stop a run early from the intermediate lines it prints ({\"step\": n, METRIC: v}): "
                        "median (Optuna's MedianPruner: below the median of earlier runs at that step, after 2 "
                        "runs and 1 step) or halving (Optuna's SuccessiveHalvingPruner, ASHA's rule); default none. "
                        "A stopped run is recorded as pruned and the search learns from it")
    g.add_argument("--prune-warmup", type=positive_int, metavar="STEP",
                   help="with --prune: stop no run before this step (MedianPruner's n_warmup_steps, "
                        "SuccessiveHalvingPruner's min_resource; default 1 and Optuna's 'auto'); raise it when "
                        "your curves cross early, as a fast starter that ends worse than a slow one")
    g.add_argument("--baseline", metavar="FILE", help="what the answer compares the winner with, measured once "
                   "before the campaign: a cubic Config (with --workload) or parameter values (with --objective; a "
                   "previous winner.yaml works); default: the workload's defaults / the space's default point")
    g.add_argument("--no-baseline", action="store_true", help="measure no baseline (the answer shows no speedup)")


def _metric_name(text: str) -> str:
    """An empty --metric fell back to the space's objective without a word."""
    from cubic.core.spec import sanitize

    if not text.strip():
        raise argparse.ArgumentTypeError("a metric name cannot be empty (leave --metric out for the space's first "
                                         "objective)")
    if sanitize(text) != text:
        raise argparse.ArgumentTypeError(f"control characters in {sanitize(text)!r}")
    return text


def check_job_flags(args: argparse.Namespace) -> None:
    if args.objective and args.workload:
        raise SpecError("give either --workload (cubic's own runs) or --objective (your job), not both",
                        field="--objective")
    if not args.objective and not args.workload:
        raise SpecError("what to run: --workload NAME|FILE or --objective 'CMD'", field="--workload")
    if args.objective and not args.space:
        raise SpecError("--objective needs --space FILE: the job's parameters", field="--space")
    if args.objective and (args.simulate or args.world_size > 1 or args.ray or args.ray_address):
        raise SpecError("--simulate/--world-size/--ray run cubic workloads; a job's processes come from --launcher",
                        field="--objective")
    if getattr(args, "baseline", None) and getattr(args, "no_baseline", False):  # one would be ignored
        raise SpecError("give --baseline FILE or --no-baseline, not both", field="--no-baseline")
    if args.launcher and not args.objective:
        raise SpecError("only with --objective (a job's processes)", field="--launcher")
    if not args.objective:  # a job's flags: with --workload they would be ignored without a word
        for flag, given in (("--prune", args.prune != "none"), ("--prune-warmup", args.prune_warmup is not None),
                            ("--nproc", args.nproc != 1)):
            if given:
                raise SpecError("only with --objective (a job's own lines); cubic's own runs do not use it",
                                field=flag)


def job_space(args: argparse.Namespace):
    from search.space import load_space

    return load_space(args.space)


def with_objective(space, metric: str | None, direction: str | None):
    """The space with --metric/--direction as its primary objective (other objectives kept)."""
    if not metric and not direction:
        return space
    from search.space import Objective

    metric = metric or space.primary.metric
    known = next((o for o in space.objectives if o.metric == metric), None)  # its direction, if the space says
    new = Objective(metric=metric, direction=direction or (known.direction if known else "maximize"))
    rest = [o for o in space.objectives[1:] if o.metric != new.metric]
    return space.model_copy(update={"objectives": [new, *rest]})


PRUNERS = {  # --prune: Optuna's own pruners over the job's intermediate lines; warmup: --prune-warmup
    "none": None,
    "median": lambda warmup: __import__("optuna").pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=warmup or 1),
    "halving": lambda warmup: __import__("optuna").pruners.SuccessiveHalvingPruner(min_resource=warmup or "auto"),
}


def job_context(args: argparse.Namespace, space) -> dict[str, Any]:
    job = {"objective": args.objective, "launcher": args.launcher, "nproc": args.nproc, "cwd": os.getcwd(),
           "timeout": args.timeout, "prune": args.prune, "prune_warmup": args.prune_warmup}
    if args.prune_warmup and args.prune == "none":
        raise SpecError("--prune-warmup needs --prune median|halving", field="--prune-warmup")
    job_runner(job, space, None, None)  # a bad command line fails now, before any run
    from cubic.core.store import redact_url

    # its runs go to the trial store too (never the password: see the workload campaign's context)
    # confirm_repeats: what `campaign resume` confirms with (it read 0 for a job, "not confirmed (--confirm-repeats 0)")
    return {"job": job, "runner": {"kind": "command", "timeout": args.timeout, "confirm_repeats": args.confirm_repeats},
            "store": redact_url(args.store) or None}


def job_runner(job: dict[str, Any], space, metric: str | None, name: str | None):
    from cubic.runners.command import CommandRunner

    from cubic.core.paths import under

    logs = under(Path(".cubic") / "jobs", name) if name else None  # a name is never a path
    make_pruner = PRUNERS.get(job.get("prune") or "none")
    return CommandRunner(job["objective"], space.param_names, metric=metric or space.primary.metric,
                         launcher=job.get("launcher"), nproc=job.get("nproc", 1), timeout_s=job.get("timeout", 300.0),
                         cwd=job.get("cwd"), logs_dir=logs,
                         pruner=make_pruner(job.get("prune_warmup")) if make_pruner else None,
                         direction=space.primary.direction)


def job_build(name: str, ctx: dict[str, Any], space, store_url: str | None):
    from cubic.cli.common import import_pending
    from cubic.codesign.evaluate import JobEvaluate, KeptRepeats
    from cubic.core.store import TrialStore

    # every run recorded in the trial store (keyed by the command line and the values), its repeats
    # kept: the same intervals and confirm step as cubic's own campaigns
    store = import_pending(TrialStore(store_url, origin="--store") if store_url else TrialStore())
    runner = job_runner(ctx["job"], space, space.primary.metric, name)
    return KeptRepeats(JobEvaluate(runner, ctx["job"], store=store, campaign=name))
