"""Campaign workers: one campaign shared by several processes, on one machine or several.

``python -m cubic.codesign.worker run``  -- one process coordinates (or, when it exists, resumes) a
campaign; this is what a supervisor restarts after a crash. Exits 3 when another process holds the
campaign's lease.
``python -m cubic.codesign.worker work`` -- one of N workers on the same campaign and storage
(``cubic campaign work NAME`` is the same for cubic's own campaigns).

Both run :class:`cubic.codesign.campaign.Campaign`'s one loop (``run()`` / ``work()``): the
process holding the campaign's lease proposes each round (warm start, plateau and target
included) and enqueues it as WAITING Optuna trials; every worker takes WAITING trials by Optuna's
compare-and-set, beats Optuna's heartbeat while it runs one, and tells the result. A worker that
dies loses only the run in flight: its trial is failed and re-enqueued once silent past the grace
period (or at once when its pid is gone from this host), and when the coordinator dies another
worker takes its lease when it expires (``--lease`` seconds). A worker whose database goes away
(a restart) waits for it (``--db-wait``) and re-attaches (cubic.codesign.storage.through_outages).

The evaluate function is user code and is loaded only when named explicitly:
``--evaluate package.module:factory``, where ``factory(space, store_url) -> evaluate`` and
``evaluate(point)`` is what :class:`cubic.codesign.campaign.Campaign` calls.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from typing import Any, Callable

from sqlalchemy.exc import IntegrityError, OperationalError

from cubic.core.spec import SpecError


def load_factory(spec: str) -> Callable[..., Any]:
    """``module:factory`` -> the callable (cubic.core.spec.load_callable, the one loader)."""
    from cubic.core.spec import load_callable

    return load_callable(spec, "--evaluate", "mypkg.evals:make_evaluate")


def _evaluate(factory, args: argparse.Namespace, space):
    """``factory(space, store_url)``, checked before the first run: a factory that raises (a wrong
    signature, its own bug) was a traceback, and one that returns no callable failed every run of the
    budget and exited 0."""
    from cubic.core.spec import call_user_code

    evaluate = call_user_code(factory, f"the factory {args.evaluate}(space, store_url)", "--evaluate", space,
                              args.store)
    if not callable(evaluate):
        raise SpecError(f"the factory {args.evaluate} returned a {type(evaluate).__name__}, not evaluate(point)",
                        field="--evaluate")
    return evaluate


def _campaign(args: argparse.Namespace, create: bool):
    from cubic.codesign.campaign import Campaign
    from cubic.codesign.storage import list_campaigns, load_meta
    from search.space import Space, load_space

    from cubic.codesign.progress import ProgressLines

    factory = load_factory(args.evaluate)
    kw = dict(lease_s=args.lease, worker=args.worker_id)
    if args.name in {c["name"] for c in list_campaigns(args.storage)}:
        space = Space.model_validate(load_meta(args.storage, args.name)["space"])
        return Campaign.resume(args.name, _evaluate(factory, args, space), storage=args.storage,
                               max_retries=args.retries, listener=ProgressLines(space), **kw)
    if not create:
        raise SpecError("no such campaign", field=args.name)
    space = load_space(args.space)
    # live progress: one line per run this process makes, on stderr
    return Campaign(space, _evaluate(factory, args, space), name=args.name, strategy=args.strategy,
                    budget=args.budget, batch_size=args.batch, seed=args.seed, storage=args.storage,
                    max_retries=args.retries, listener=ProgressLines(space), **kw)


def _create_or_attach(args: argparse.Namespace):
    """Several workers start at once: the first creates the campaign, the others resume it."""
    for attempt in range(50):
        try:
            return _campaign(args, create=True)
        except SpecError as e:
            if "exists" not in str(e) or attempt == 49:
                raise
        except (IntegrityError, OperationalError):
            if attempt == 49:
                raise
        time.sleep(random.uniform(0.05, 0.2))
    raise AssertionError("unreachable")


class OutageLog:
    """A worker's account of database outages it waited out (through_outages' ``on_outage``): one
    line on stderr per outage as it happens, and a suffix for the worker's closing line."""

    def __init__(self, prog: str):
        self.prog, self.lines = prog, []

    def __call__(self, line: str) -> None:
        from cubic.core.spec import sanitize

        self.lines.append(line)
        print(f"{self.prog}: store error: {sanitize(line)}; the database answers again: re-attached",
              file=sys.stderr, flush=True)

    def suffix(self) -> str:
        return (f"; re-attached after {len(self.lines)} database outage(s), runs counted since"
                if self.lines else "")


def main(argv: list[str] | None = None) -> int:
    from cubic.codesign.storage import DB_WAIT_S, LEASE_S, LeaseHeld, through_outages
    from cubic.core.argtypes import int_at_most, nonnegative_float, nonnegative_int, positive_float
    from cubic.core.spec import MAX_BUDGET
    from search.strategy_names import STRATEGIES

    class OneLine(argparse.ArgumentParser):  # as the CLI's parser: one line (the usage is one --help away)
        def error(self, message: str):
            self.exit(2, f"cubic.codesign.worker: error: {' '.join(message.split())} (see --help)\n")

    p = OneLine(prog="python -m cubic.codesign.worker", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("mode", choices=["run", "work"], help="run: coordinate/resume the campaign; "
                                                         "work: one of several workers")
    p.add_argument("--storage", required=True, metavar="URL", help="the campaign's Optuna storage (SQLAlchemy URL)")
    p.add_argument("--name", required=True)
    p.add_argument("--evaluate", required=True, metavar="MODULE:FACTORY")
    p.add_argument("--store", metavar="URL", help="trial store URL handed to the factory")
    p.add_argument("--space", metavar="FILE", help="space YAML (when creating)")
    # the CLI's flag types (bounds refused in one line while parsing; they were plain int/float here)
    p.add_argument("--strategy", default="tpe", choices=sorted(STRATEGIES))
    p.add_argument("--budget", type=int_at_most(MAX_BUDGET), default=40)
    p.add_argument("--batch", type=int_at_most(MAX_BUDGET), default=4)
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--retries", type=int_at_most(100, low=0), default=2)
    p.add_argument("--worker-id")
    p.add_argument("--lease", type=positive_float, default=LEASE_S, metavar="S",
                   help=f"the coordinator's lease, renewed every third of it (default {LEASE_S:.0f})")
    p.add_argument("--db-wait", type=nonnegative_float, default=DB_WAIT_S, metavar="S",
                   help="after a database outage (a restart), wait this long for it to answer, then go on "
                        f"(default {DB_WAIT_S:.0f}; 0: exit 1 at once)")
    args = p.parse_args(argv)
    from cubic.core.spec import sanitize
    from cubic.core.store import redact_url, scrub_error, storage_error_line

    outage = OutageLog("cubic.codesign.worker")

    def body(campaign) -> int:
        if args.mode == "run":
            s = campaign.run()
            print(f"{s.name}: {s.runs} runs ({s.served} served from the trial store), stopped on {s.stop_reason}"
                  + outage.suffix())
            return 0
        rep = campaign.work()
        print(f"worker {rep.worker}: {rep.runs} runs ({rep.served} served from the trial store)"
              f"{'; coordinated' if rep.coordinated else ''}{outage.suffix()}")
        return 0

    try:
        return through_outages(lambda: _create_or_attach(args), body, [args.storage, args.store],
                               wait_s=args.db_wait, on_outage=outage)
    except LeaseHeld as e:
        print(f"cubic.codesign.worker: {e}", file=sys.stderr)
        return 3
    except (SpecError, ValueError) as e:
        msg = " ".join(str(e).split())
        for url in (args.storage, args.store):
            if url:
                msg = scrub_error(msg.replace(url, redact_url(url)), url)
        print(f"cubic.codesign.worker: error: {sanitize(msg)}", file=sys.stderr)
        return 2
    except Exception as e:  # the database went away mid-campaign: one line, no password; resume later
        msg = storage_error_line(e, args.storage, args.store)
        if msg is None:
            raise
        print(f"cubic.codesign.worker: store error: {sanitize(msg)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
