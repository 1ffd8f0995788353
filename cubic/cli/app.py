"""The ``cubic`` command: ``cubic <noun> <verb>`` (argparse).

Built-in nouns: ``workloads``, ``run``, ``trials``. Feature packages add theirs through a
``register(subparsers)`` function in their own module (see :data:`PLUGINS`); each parser they add
sets ``func=handler`` with ``handler(args) -> int`` (exit code). They may reuse
:func:`add_store_argument`, :func:`open_store`, :func:`progress_bar` and :func:`stdout_console`.

Exit codes: 0 ok, 1 a failed run (still recorded and printed), 2 bad input (one line on stderr:
``cubic: error: <message>``), 3 store error (``cubic: store error: <message>``; a result that could
not be stored is kept in the pending file, see cubic.core.store), 130 interrupted (SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from cubic import __version__
from cubic.core.spec import MAX_REPEATS, MAX_STEPS, MAX_THREADS, MAX_WORLD_SIZE, SpecError
from cubic.cli.common import (  # noqa: F401  (re-exported for callers of cubic.cli.app)
    STORE_HELP, _expected_fingerprint_hash, _output_dir, local_runner, _make_runner, int_at_most, nonnegative_int,
    positive_float, positive_int, _simulated_runner, _writable_path, add_store_argument, open_store, progress_bar,
    stdout_console)

# Modules that add nouns when present; a missing one is skipped, any other import error surfaces.
PLUGINS = ("cubic.cli.shard", "cubic.cli.fp8", "cubic.cli.sim", "cubic.cli.campaign")

MAX_ROW_ID = 2**63 - 1  # a database's integer key: a larger ID is no row (SQLite raised OverflowError)



def cmd_workloads_list(args: argparse.Namespace) -> int:
    from cubic.cli.run_report import workload_summary, workloads_table
    from cubic.core.workloads import DEFAULT_WORKLOADS

    if args.json:
        print(json.dumps([workload_summary(w) for w in DEFAULT_WORKLOADS.values()], indent=2))
    else:
        stdout_console().print(workloads_table(DEFAULT_WORKLOADS.values()))
    return 0


def cmd_workloads_show(args: argparse.Namespace) -> int:
    from cubic.core.workloads import load_workload

    data = load_workload(args.workload).model_dump(mode="json")
    if args.format == "json":
        print(json.dumps(data, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(data, sort_keys=False), end="")
    return 0


def _add_workloads(sub: Any) -> None:
    p = sub.add_parser("workloads", help="list the embedded default workloads, or show one in full",
                       description="List the embedded default workloads (no verb, or 'list'), or print "
                                   "one validated workload spec in full ('show') to copy and edit.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_workloads_list)
    verbs = p.add_subparsers(dest="verb", metavar="<verb>")
    ls = verbs.add_parser("list", help="the embedded defaults as a table (default verb)",
                          description="The embedded default workloads as a table.")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_workloads_list)
    show = verbs.add_parser("show", help="print one workload spec in full",
                            description="Print a validated workload (embedded name or YAML/JSON file) in full.")
    show.add_argument("workload", metavar="NAME|FILE", help="an embedded default name or a workload file")
    show.add_argument("--format", choices=["yaml", "json"], default="yaml", help="output format (default yaml)")
    show.set_defaults(func=cmd_workloads_show)


# -- run ------------------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace) -> int:
    """Serve the config's pooled estimate from the store when it holds --repeats good repeats; else
    run the missing repeats (each in a fresh child process), pool them with the stored ones, print
    the result and write --json, and only then record every new repeat. A store write that fails is
    a store error (exit 3), never a failed run: the result was printed already and is kept in the
    pending file."""
    from cubic.cli.common import check_topology_refs, load_checked_config
    from cubic.core.config import Config
    from cubic.core.result import RunInterrupted
    from cubic.core.stats import Repeat, contention, cores_available, pool, pooled_result
    from cubic.runners.base import check_placement_fits
    from cubic.cli.run_report import print_result
    from cubic.core.workloads import load_workload

    workload = load_workload(args.workload)
    check_topology_refs(workload.topology, args.workload)
    processes = None if args.simulate or args.plan else args.world_size  # --plan replaces the config's plan
    config = load_checked_config(args.config, processes) if args.config else None
    if config is not None:
        # bad knobs, batch or FP8 sites: bad input now, not a failed run from the child
        check_placement_fits(config.apply(workload, source=args.config), config, source=args.config)
    json_out = _writable_path(args.json_out, "--json") if args.json_out else None
    if args.world_size > 1 or args.plan:
        runner, config = _distributed_runner(args, workload, config or Config())
    else:
        runner = _make_runner(args)
        resolve = getattr(runner, "resolve_config", None)
        if callable(resolve):  # the simulator's: an unset dense dtype read as `cubic sim predict` does, before hashing
            config = resolve(config)
            config.apply(workload)
        elif config is None:  # a runner's own default
            default = getattr(runner, "default_config", None)
            config = default() if callable(default) else Config()
            config.apply(workload)
    store = open_store(args)
    source = getattr(runner, "source", "measured")
    fp_hash = _expected_fingerprint_hash(runner)
    key = (workload.content_hash(), config.content_hash(), fp_hash, source)
    length = dict(steps=args.steps, warmup=args.warmup)
    served = None
    if fp_hash is not None and not args.force:
        served = store.serve(*key, **length, threads=getattr(runner, "threads", None))
    console = stdout_console()
    if served is not None and not args.remeasure and served.satisfies(args.repeats):
        print_result(served.result, console, trial_id=served.trials[-1].id, served_from_store=True)
        _print_pooled(console, served.result)
        if json_out is not None:
            json_out.write_text(served.result.model_dump_json(indent=2) + "\n")
        return 0 if served.result.ok else 1

    # the stored repeats this run adds to (none after --force or a stored failure)
    have = [] if served is None or served.failure else served.trials
    need = args.repeats if (args.remeasure or not have) else args.repeats - served.good
    attempt = store.next_attempt(*key, **length) if fp_hash is not None else 1
    label = "SIMULATED " if source == "simulated" else ""
    new: list[tuple[Any, int]] = []  # (Result, attempt) of each fresh repeat
    try:
        for i in range(need):
            what = f"repeat {i + 1}/{need}: " if need > 1 else ""
            with progress_bar(f"{label}{workload.name}: {what}{args.warmup} warm-up + {args.steps} steps") as callback:
                r = runner.run(workload, config, **length, progress=callback)
            new.append((r, attempt))
            attempt = attempt + 1 if r.transient else 1
            if not r.ok:
                break  # a failed repeat ends the run: a deterministic failure would fail again
    except RunInterrupted as e:  # recorded as killed (transient), then the interrupt goes on
        new.append((e.result, attempt))
        _record_repeats(store, workload, config, new, fp_hash, length, console)
        raise
    last = new[-1][0] if new else None
    if last is not None and not last.ok:
        result = last
    else:
        fresh = [r for r, _ in new]
        reps = [Repeat(dict(t.result.metrics), bool(t.contended), t.id) for t in have]
        reps += [Repeat(dict(r.metrics), contention(r.metrics, r.extra, cores_available(r.fingerprint)) is not None)
                 for r in fresh]
        # as the store will serve it (TrialStore.serve): the other configs' noise, else the floor
        noise = store.noise(fp_hash, source, **length, exclude=key[:2]) if fp_hash is not None else None
        floor = store.floor_for(fp_hash or "", source)
        result = pooled_result([t.result for t in have] + fresh, pool(reps, noise, floor))
    # the result is out (screen and --json) before anything is written to the store
    print_result(result, console)
    _print_pooled(console, result)
    if json_out is not None:
        json_out.write_text(result.model_dump_json(indent=2) + "\n")
    _record_repeats(store, workload, config, new, fp_hash, length, console)
    return 0 if result.ok else 1


def _distributed_runner(args: argparse.Namespace, workload: Any, config: Any) -> tuple[Any, Any]:
    """``--world-size N`` (N > 1): the multi-process runner, with ``--plan`` put into the config."""
    from cubic.runners.distributed import DistributedRunner, config_with_plan

    if args.world_size < 2:
        raise SpecError("a plan needs --world-size of 2 or more (1 is the local single-process runner)",
                        field="--plan")
    if args.simulate:
        raise SpecError("--world-size is for local multi-process runs; a simulated cluster has its own size",
                        field="--world-size")
    if args.plan:
        config = config_with_plan(workload, config, args.plan, args.world_size, args.config)
    device = "cpu" if args.device == "auto" else args.device
    return DistributedRunner(args.world_size, timeout_s=args.timeout, device=device,
                             threads=args.threads or 1), config


def _record_repeats(store: Any, workload: Any, config: Any, new: list[tuple[Any, int]], fp_hash: str | None,
                    length: dict[str, int], console: Any) -> None:
    """Record each fresh repeat; when the store fails, every one of them still goes to the pending
    file (TrialStore.record keeps each), then the store error is raised."""
    from cubic.core.store import StoreError

    ids, error = [], None
    for r, attempt in new:
        try:
            ids.append(store.record(workload, config, r, attempt=attempt, fingerprint_hash=fp_hash, **length))
        except StoreError as e:
            error = error or e
    if ids:
        console.print("recorded as " + ", ".join(f"trial #{i}" for i in ids))
    if error is not None:
        raise error


def _print_pooled(console: Any, result: Any) -> None:
    from cubic.cli.run_report import interval_line

    line = interval_line(result)
    if line:
        console.print(line, markup=False)


def _add_run(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="train a workload for a few steps and measure it (or simulate it on a cluster)",
        description="Run warm-up plus N timed training steps of a workload under a co-design config, record "
                    "the result in the trial store and print it. A repeated run of the same config, length and "
                    "machine fingerprint is served from the store (the pooled estimate of its stored repeats) "
                    "unless --force or --remeasure. The result is printed and written to --json before the "
                    "store write; if that write fails the result is kept in .cubic/pending.jsonl "
                    "($CUBIC_PENDING) and imported by the next command. Exit 0 ok, 1 failed run (recorded), "
                    "2 bad input, 3 store error.",
    )
    p.add_argument("--workload", required=True, metavar="NAME|FILE", help="an embedded default name or a workload file")
    p.add_argument("--config", metavar="FILE", help="co-design config (JSON or YAML); default: all defaults "
                                                    "(with --simulate: the simulator's default, bf16 dense, as "
                                                    "`cubic sim predict`; a config not setting "
                                                    "kernels.dense_dtype is simulated in bf16 too)")
    p.add_argument("--steps", type=int_at_most(MAX_STEPS), default=50, help="timed training steps (default 50)")
    p.add_argument("--warmup", type=int_at_most(MAX_STEPS, low=0), default=5, help="untimed warm-up steps (default 5)")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="S",
                   help="time limit of the run in seconds (default 600)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int_at_most(MAX_THREADS), default=None,
                   help="intra-op threads of the run (default: torch's default, one per core); on a shared "
                        "machine 1 is faster and far less noisy")
    p.add_argument("--world-size", type=int_at_most(MAX_WORLD_SIZE), default=1, metavar="N",
                   help="train on N local processes (torch.distributed, real all-to-alls; the same worker "
                        "torchrun starts with 'python -m cubic.runners.launch'); 1 = one process (default)")
    p.add_argument("--plan", metavar="FILE", help="sharding plan (JSON) for --world-size ranks; default: the "
                                                  "config's sharding.planner, else size_lookup_greedy")
    p.add_argument("--force", action="store_true",
                   help="run --repeats fresh repeats and report only them, even if the store holds this trial")
    p.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=1, metavar="R",
                   help="repeats of the run, each in a fresh process (default 1); the store keeps every repeat "
                        "and serves their pooled median and 95%% interval once it holds R uncontended ones")
    p.add_argument("--remeasure", action="store_true",
                   help="add R fresh repeats to those stored (they are pooled together)")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write the Result as JSON to this file")
    p.add_argument("--simulate", metavar="CLUSTERxN",
                   help="simulate on a modelled cluster instead of measuring, e.g. h100x64 (h100, h200, a100), "
                        "or a cluster file: FILE.yamlx64, or FILE.yaml giving world_size (docs/clusters.md); "
                        "SIMULATED output")
    add_store_argument(p)
    p.set_defaults(func=cmd_run)


# -- trials ---------------------------------------------------------------------------------------

def _filters(args: argparse.Namespace, store: Any) -> dict[str, Any]:
    campaign = args.campaign
    if (campaign is not None and campaign.isdigit() and int(campaign) <= MAX_ROW_ID
            and store.get_campaign(campaign) is None):
        campaign = int(campaign)  # a campaign id
    return dict(campaign=campaign, workload=args.workload, source=args.source, status=args.status,
                limit=args.limit)


def cmd_trials_list(args: argparse.Namespace) -> int:
    from cubic.cli.run_report import trials_table
    from cubic.core.store import NoStore

    try:
        store = open_store(args, create=False)
    except NoStore:  # nothing recorded yet: no trials, and no empty store made by looking
        print("[]" if args.json else "no trials recorded yet")
        return 0
    trials = store.trials(**_filters(args, store))
    if args.json:
        print(json.dumps([t.model_dump(mode="json", exclude={"result"}) for t in trials], indent=2))
        return 0
    console = stdout_console()
    if not trials:
        console.print("no trials match")
        return 0
    console.print(trials_table(trials, campaign_names={c.id: c.name for c in store.campaigns()}))
    return 0


def cmd_trials_show(args: argparse.Namespace) -> int:
    from cubic.cli.run_report import print_result

    trial = open_store(args, create=False).get_trial(args.id)
    if trial is None:
        raise SpecError(f"no trial {args.id} in the store", field="ID")
    if args.json:
        print(json.dumps(trial.model_dump(mode="json"), indent=2))
        return 0
    console = stdout_console()
    print_result(trial.result, console, trial_id=trial.id)
    if trial.status == "ok":  # the configuration's interval: the same one `cubic run` serves for it
        served = open_store(args).serve(trial.workload_hash, trial.config_hash, trial.fingerprint_hash,
                                        trial.source, steps=trial.steps, warmup=trial.warmup,
                                        threads=(trial.result.extra or {}).get("threads"))
        if trial.config.get("kind") == "job":  # a user's job: its figures' intervals by the campaign's rule
            _print_job_intervals(console, open_store(args), trial)
        elif served.result is not None and served.result.ok:
            _print_pooled(console, served.result)
    length = f"steps {trial.steps} warm-up {trial.warmup}" if trial.steps is not None else \
        ("a run of a user's job (--objective)" if trial.config.get("kind") == "job" else "run length not recorded")
    console.print(f"recorded {trial.created_at:%Y-%m-%d %H:%M:%S} UTC | code {trial.code_version} | "
                  f"attempt {trial.attempt} | {length} | fingerprint {trial.fingerprint_hash}")
    console.print_json(json.dumps(trial.config))
    return 0


def _print_job_intervals(console: Any, store: Any, trial: Any) -> None:
    """A job's figures at this trial's values, each with the 95% interval of a fresh run from every
    stored successful run of the job on this machine (cubic.codesign.evaluate.job_estimate: the
    rule the campaign's lines use, over the store's runs instead of one session's)."""
    from cubic.codesign.answer import fmt
    from cubic.codesign.evaluate import job_estimate

    groups: dict[str, list[dict[str, float]]] = {}
    for t in store.trials(workload=trial.workload, status="ok"):
        if (t.workload_hash, t.fingerprint_hash) == (trial.workload_hash, trial.fingerprint_hash):
            groups.setdefault(t.config_hash, []).append(t.result.metrics)
    for metric in sorted(trial.result.metrics):
        if metric.endswith(("_ci_lo", "_ci_hi")) or metric in ("wall_time_s", "peak_rss_bytes"):
            continue
        e = job_estimate(groups, trial.config_hash, metric)
        if e is not None:  # (a zero width says so: its basis names the noise it rests on)
            console.print(f"{metric} {fmt(e.value)}, 95% interval of a fresh run [{fmt(e.lo)}, {fmt(e.hi)}] "
                          f"({e.n} run{'s' if e.n != 1 else ''}; {e.basis})", markup=False)


def cmd_trials_export(args: argparse.Namespace) -> int:
    out = _writable_path(args.out, "--out")
    fmt = args.format or {".parquet": "parquet", ".csv": "csv"}.get(out.suffix.lower())
    if fmt is None:  # x.xlsx or x.json was written as CSV under that name
        raise SpecError(f"cannot tell the format from {out.name!r}: name it .csv or .parquet, or pass --format",
                        field="--out")
    store = open_store(args, create=False)
    n = store.export(out, fmt, **_filters(args, store))
    print(f"wrote {n} trial{'s' if n != 1 else ''} to {out} ({fmt})")
    return 0


def _add_trial_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--campaign", metavar="NAME|ID", help="only trials of this campaign")
    p.add_argument("--workload", metavar="NAME", help="only trials of this workload")
    p.add_argument("--source", choices=["measured", "simulated"],
                   help="only measured or only simulated trials (default: both, labelled)")
    p.add_argument("--status", choices=["ok", "failed"], help="only ok or only failed trials")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the newest N")
    add_store_argument(p)


def _add_trials(sub: Any) -> None:
    p = sub.add_parser("trials", help="list, show and export the recorded trials",
                       description="The trial store: every run, measured or simulated, ok or failed.")
    verbs = p.add_subparsers(dest="verb", metavar="<verb>", required=True)
    ls = verbs.add_parser("list", help="recorded trials as a table", description="Recorded trials, oldest first.")
    _add_trial_filters(ls)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=cmd_trials_list)
    show = verbs.add_parser("show", help="one trial in full", description="One trial: its result and config.")
    show.add_argument("id", type=int_at_most(MAX_ROW_ID), metavar="ID", help="trial id (see 'cubic trials list')")
    show.add_argument("--json", action="store_true", help="the stored trial and full Result as JSON")
    add_store_argument(show)
    show.set_defaults(func=cmd_trials_show)
    ex = verbs.add_parser("export", help="write trials to CSV or Parquet (one row per trial, metrics flattened)",
                          description="Write trials to CSV or Parquet via pandas: one row per trial, "
                                      "metrics.* and phases_ms.* columns flattened, config as JSON.")
    ex.add_argument("--format", choices=["csv", "parquet"], help="default: from --out's suffix (.csv or .parquet)")
    ex.add_argument("--out", required=True, metavar="PATH", help="output file")
    _add_trial_filters(ex)
    ex.set_defaults(func=cmd_trials_export)


# -- entry point ----------------------------------------------------------------------------------

def register_plugins(sub: Any, modules: Sequence[str] = PLUGINS) -> list[str]:
    """Import each present plugin module and let it add its nouns; returns those registered."""
    registered = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            # skip only when the plugin itself (or its package) is absent, not a missing dependency
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue
            raise
        module.register(sub)
        registered.append(name)
    return registered


class CubicParser(argparse.ArgumentParser):
    """Every cubic parser (sub-commands inherit the class): no abbreviations (``--step 3`` is refused,
    not taken as ``--steps``), "did you mean" for an unknown flag, a flag type's own reason for a
    bad value, and output paths (``--report``, ``--out``, ``--save``, ``--json FILE``) checked while parsing,
    before any work: a file's folder must exist, a report folder can be made (it is made when written,
    so a refused command leaves none), a file is not a folder."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw["allow_abbrev"] = False
        super().__init__(*args, **kw)

    def add_argument(self, *args: Any, **kw: Any):
        if any(a in ("--report", "--out", "--save") for a in args) or ("--json" in args and kw.get("metavar")):
            kw["type"] = _output_dir if "--report" in args or kw.get("metavar") == "DIR" else _output_file
        return super().add_argument(*args, **kw)

    def _get_value(self, action, arg_string):  # argparse turns a type's ValueError into "invalid <fn> value"
        fn = action.type
        if callable(fn) and fn not in (int, float, str) and not isinstance(fn, type):
            try:
                return fn(arg_string)
            except argparse.ArgumentTypeError:
                pass  # argparse words it: "argument --x: <message>"
            except (TypeError, ValueError) as e:
                raise argparse.ArgumentError(action, _one_line(e)) from None
        return super()._get_value(action, arg_string)

    def error(self, message: str):  # one line (the usage is one --help away)
        self.exit(2, f"cubic: error: {' '.join(message.split())} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(ns, "_cubic_unknown_in"):  # the innermost parser with leftovers
            setattr(ns, "_cubic_unknown_in", self)
        return ns, extras

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        where = vars(ns).pop("_cubic_unknown_in", self)
        if extras:
            import difflib

            msg = f"unrecognized arguments: {' '.join(extras)}"
            for word in extras:
                flag = word.split("=", 1)[0]
                if flag.startswith("-"):
                    close = difflib.get_close_matches(flag, list(where._option_string_actions), n=1, cutoff=0.6)
                    if close:
                        msg += f" (did you mean {close[0]}?)"
                        break
            where.error(msg)
        return ns


def _output_file(text: str) -> str:
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name")
    if not p.parent.is_dir():  # a file's folder is not made up from a typo
        raise argparse.ArgumentTypeError(f"the folder {p.parent} does not exist")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = CubicParser(
        prog="cubic",
        description="cubic: sharding plans, FP8 placement and co-design search for training recommendation "
                    "models. Every run lands in the trial store.",
    )
    parser.add_argument("--version", action="version", version=f"cubic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    _add_workloads(sub)
    _add_run(sub)
    _add_trials(sub)
    register_plugins(sub)
    return parser


def _one_line(err: BaseException, args: Any = None) -> str:
    """One printable line: whitespace folded, passwords of the command's URLs removed, control
    characters shown escaped (a message may quote a name from a user file)."""
    from pydantic import ValidationError

    from cubic.core.spec import SpecError, sanitize, spec_error_from_validation

    if isinstance(err, ValidationError):  # a value object refused what reached it: its field, not pydantic's dump
        err = spec_error_from_validation(err)
    if (isinstance(err, SpecError) and err.field in ("storage", "store", "campaign") and err.source is None
            and hasattr(args, err.field)):  # the library's name for what the user sets with the flag
        flag = f"--{err.field}"
        if err.field == "storage" and not args.storage and os.environ.get("CUBIC_CAMPAIGNS"):
            flag = "CUBIC_CAMPAIGNS"  # the storage came from the environment, not from a flag
        err = SpecError(err.message, field=flag)
    text = " ".join(str(err).split()) or type(err).__name__
    urls = [u for u in (getattr(args, "store", None), getattr(args, "storage", None)) if isinstance(u, str)]
    if urls:
        from cubic.core.store import scrub_error

        text = scrub_error(text, *urls)
    return sanitize(text)[:500]


def _sigterm_interrupts() -> None:
    """SIGTERM interrupts like Ctrl-C does, so a run in progress is recorded as killed (not lost)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        def on_term(signum, _frame):  # noqa: ANN001
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, on_term)


def main(argv: Sequence[str] | None = None) -> int:
    args = None
    from cubic.core.store import StoreError

    _sigterm_interrupts()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except StoreError as e:
        print(f"cubic: store error: {_one_line(e)}", file=sys.stderr)
        return 3
    except SystemExit as e:  # argparse: --help (0) and usage errors (2), already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        print("cubic: interrupted", file=sys.stderr)
        return 130
    except (SpecError, ValueError) as e:
        print(f"cubic: error: {_one_line(e, args)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `cubic trials list | head`: the reader left; stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # unreadable input, unwritable output, a full disk
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"cubic: error: {_one_line(where + (e.strerror or str(e)), args)}", file=sys.stderr)
        return 2
    except MemoryError:
        print("cubic: error: out of memory (an input asks for more than this machine holds)", file=sys.stderr)
        return 2
    except Exception as e:
        from cubic.core.store import storage_error_line

        urls = [getattr(args, k, None) for k in ("store", "storage")]
        line = storage_error_line(e, *(u for u in urls if isinstance(u, str)))
        if line is not None:  # the store failed mid-command: not bad input, but one line
            print(f"cubic: store error: {_one_line(line)}", file=sys.stderr)
            return 3
        raise


if __name__ == "__main__":
    sys.exit(main())
