"""What a campaign command prints when it ends (``cubic campaign run``, ``resume``): the summary of each
campaign, the report and its answer, and the exit code a script reads."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def print_summaries(summaries, as_json: bool, metric: str = "examples_per_s") -> None:
    if as_json:
        print(json.dumps([{**s.to_json(), "served_from_store": s.served} for s in summaries], indent=2,
                         default=str))
        return
    from cubic.cli.common import stdout_console
    from cubic.codesign.answer import fmt

    con = stdout_console()
    for s in summaries:
        best = s.best_metrics or {}
        stopped = f", {s.pruned} stopped early by the pruner" if s.pruned else ""
        con.print(f"[bold]{s.name}[/bold]: {s.runs} runs ({s.served} served from the trial store{stopped}), "
                  f"stopped on {s.stop_reason}; best {metric} {fmt(best.get(metric))} at {s.best_point}")
        if s.proxy:
            from cost_models.proxy import cv_tau_text

            con.print(f"  proxy: {s.proxy.get('family')} ({cv_tau_text(s.proxy)})")
        if s.pruning:
            from cubic.codesign.answer import pruning_note

            con.print(f"  {pruning_note(s.pruning)}", markup=False, highlight=False)
        c = s.confirm
        if c and c.get("winner"):
            from cubic.codesign.answer import confirm_lines

            for line in confirm_lines(c):
                con.print("  " + line, markup=False)


def finish(args: argparse.Namespace, summaries, storage: str, space, baselines: list[str] | None) -> int:
    """What `campaign run` and `campaign resume` end with alike: the summary, the report and its answer
    (resume wrote the report without printing the answer), and exit 1 when no run succeeded."""
    print_summaries(summaries, args.json, space.primary.metric)
    if args.report:
        from cubic.codesign.report import write_report

        report_dir = Path(args.report)
        path = write_report(args.name, storage=storage, out_dir=report_dir, baselines=baselines, store_url=args.store)
        print(f"report: {path}", file=sys.stderr)
        if not args.json:
            print((report_dir / "answer.md").read_text(), end="")
    if summaries and all(s.best_point is None for s in summaries):  # nothing to act on: a script must see it
        print(f"cubic: error: no run of campaign {args.name!r} succeeded within its constraints "
              f"({sum(s.runs for s in summaries)} runs); see the failure reasons above", file=sys.stderr)
        return 1
    return 0
