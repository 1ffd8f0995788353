"""Reliability benchmark: faults, SIGKILL and resume, concurrent workers, bad input.

    .venv/bin/python -m experiments.reliability [--quick] [--kills N] [--fuzz N] [--no-postgres]

Writes results/reliability.json and results/reliability.png. Every figure is MEASURED on this
machine (the runs themselves are a fast deterministic stand-in, :class:`FastRunner`, except in the
fault section, which uses the real :class:`cubic.runners.local.LocalRunner` with test-only faults):

- faults injected and survived by kind (raise, oom, hang, nan, kill) in a campaign over the real
  LocalRunner; deterministic failures recorded once and never retried or re-proposed, transient
  ones retried a bounded number of times;
- kills survived: a campaign process SIGKILLed at random moments and resumed each time; trials
  lost and duplicated (target 0), database integrity, equality with an uninterrupted campaign;
- concurrent workers: 4 ``python -m cubic.codesign.worker work`` processes on one campaign and one store,
  on SQLite and on PostgreSQL (scripts/start_postgres.sh); lost/duplicated trials, "database is
  locked" failures, and the store's write throughput in trials/s with 4 writer processes;
- kills through the real CLI (``cubic campaign run``/``resume --objective``, the ``cubic`` proxy
  retraining before each round) and what a user reads after them (trials_dataframe rows,
  duplicated points, FAILs a kill made, ``campaign list`` runs);
- first starts: processes released at one instant on a new storage and store (SQLite, PostgreSQL);
- read-back attacks: malformed pending-file lines of each kind, corrupt stored rows, hostile names;
- fuzz: generated bad inputs to the workload, table CSV, space, config, plan and placement parsers
  and the CLI; uncaught exceptions (target 0) and partial writes to the store (target 0).

The attack groups are modules of this package (kill, concurrency, faults, fuzz, security); they
are also the tests' harness (tests/test_cli_reliability_*.py run them small).
"""

from __future__ import annotations

import argparse
import os
import sys
import json
import time
from pathlib import Path
from typing import Any

from experiments.reliability.common import ROOT  # noqa: F401 (puts the repository on sys.path)
from cubic.testing import FAULT_PLAN, FaultyRunner
from experiments.reliability.concurrency import (
    concurrent_workers,
    fault_outcome_problems,
    fresh_postgres_database,
    private_postgres,
    start_postgres,
    store_throughput,
)
from experiments.reliability.faults import fault_campaign
from experiments.reliability.fuzz import fuzz
from experiments.reliability.firststart import first_open, first_start
from experiments.reliability.kill import kill_resume, kill_resume_cli
from experiments.reliability.readback import hostile_names, pending_attacks, stored_row_attacks
from experiments.reliability.security import security_audit



def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile

    from experiments.common import run_context

    args = _parse_args(argv)
    kills = args.kills or (3 if args.quick else 20)
    n_fuzz = args.fuzz or (30 if args.quick else 300)
    os.environ["CUBIC_ALLOW_FAULTS"] = "1"  # this process injects test-only faults
    payload: dict[str, Any] = {"context": run_context("measured"), "quick": args.quick,
                               "note": "all figures MEASURED on this (shared, loaded) machine; the campaign and "
                                       "concurrency sections use a deterministic stand-in runner (FastRunner) so "
                                       "that stores and processes, not training, are what is exercised"}
    tmp = Path(tempfile.mkdtemp(prefix="cubic-reliability-"))
    try:
        _run_sections(payload, tmp, args, kills, n_fuzz)
    except BaseException:  # a failed run's stores and logs are what explains it: kept
        print(f"reliability: its working files are kept in {tmp}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)  # tens of MB of stores and logs per run, read by nothing after it
    return 0


def _run_sections(payload: dict[str, Any], tmp: Path, args: argparse.Namespace, kills: int, n_fuzz: int) -> None:
    """Every section in order, then the summary, targets, plot and results file."""
    from experiments.common import png_path, write_result

    # each section fills its keys of payload, in this order (the order of the JSON written)
    survived = _faults_section(payload, tmp, args.quick)
    kr = _kill_resume_section(payload, tmp, kills, args.quick)
    kc = _kill_resume_cli_section(payload, tmp, args.quick)
    _read_back_section(payload, tmp)
    pg_url, why = _concurrency_section(payload, tmp, args.quick, args.no_postgres)
    payload["cluster_faults"] = _cluster_faults(pg_url, why)
    payload["soak"] = _soak(pg_url, why, args.quick)
    _first_start_section(payload, tmp, pg_url, args.quick)
    fz = _fuzz_section(payload, tmp, n_fuzz)

    audit = security_audit()
    payload["security_audit"] = audit
    print("security audit:", {k: len(v) for k, v in audit.items()})

    inputs = _input_attacks_section(payload, args.quick)
    payload["summary"] = _summary(payload, survived, kr, fz)
    payload["targets"] = _targets(payload, inputs, kr, kills)
    payload["targets"].update(_issue27_targets(payload, kr, kc))
    print(json.dumps(payload["summary"], indent=2))
    _plot(payload, png_path("reliability"))
    print("wrote", write_result("reliability", payload))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: few kills, few inputs")
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--fuzz", type=int, default=None, help="generated inputs per target")
    ap.add_argument("--no-postgres", action="store_true")
    return ap.parse_args(argv)


def _faults_section(payload: dict[str, Any], tmp: Path, quick: bool) -> dict[str, Any]:
    """payload["faults"]: a campaign over the real LocalRunner with injected faults. Returns the
    kinds injected (every kind but "none"), for the summary."""
    print("faults: a campaign over the real LocalRunner with injected faults ...", flush=True)
    fr = fault_campaign(FaultyRunner(timeout_s=90.0), tmp / "faults", budget=len(FAULT_PLAN) + (0 if quick else 1),
                        max_retries=2)
    survived = {k: v for k, v in fr["by_kind"].items() if k != "none"}
    payload["faults"] = {**fr, "injected": len(survived), "campaign_went_on": fr["runs"] == fr["budget"]}
    for k, v in fr["by_kind"].items():
        print(f"  {k:10s} -> {v['recorded_as']:8s} attempts {v['attempts']}  store {v['store_rows']}")
    return survived


def _kill_resume_section(payload: dict[str, Any], tmp: Path, kills: int, quick: bool) -> dict[str, Any]:
    """payload["kill_resume"]: ``kills`` SIGKILLs of a campaign process, resumed each time."""
    print(f"kill and resume: {kills} SIGKILLs ...", flush=True)
    kr = kill_resume(tmp / "kill", kills=kills, budget=40 if quick else 140, rng_seed=1)
    payload["kill_resume"] = kr
    print(f"  kills {kr['kills']}, trials {kr['trials']}/{kr['budget']}, lost {kr['lost_trials']}, duplicated "
          f"{kr['duplicated_trials']}, store {kr['store']}, integrity {kr['integrity_check']}, "
          f"equals uninterrupted {kr['equals_uninterrupted']}, {kr['elapsed_s']} s")
    return kr


def _kill_resume_cli_section(payload: dict[str, Any], tmp: Path, quick: bool) -> dict[str, Any]:
    """payload["kill_resume_cli"]: kills through the real CLI, and what a user reads after them."""
    print("kill and resume through the real CLI (campaign run/resume --objective, cubic proxy) ...", flush=True)
    kc = kill_resume_cli(tmp / "killcli", kills=3 if quick else 8, budget=6 if quick else 12, batch=2,
                         strategy="cubic", max_wait_s=3.0, rng_seed=1)
    payload["kill_resume_cli"] = kc
    print(f"  kills {kc['kills']}, user sees {kc['user_view']}, {kc['elapsed_s']} s")
    return kc


def _read_back_section(payload: dict[str, Any], tmp: Path) -> None:
    """payload["read_back"]: malformed pending lines, corrupt stored rows, hostile names."""
    print("read-back attacks: pending lines, stored rows, hostile names ...", flush=True)
    payload["read_back"] = {"pending": pending_attacks(tmp / "pending"), "stored_rows": stored_row_attacks(tmp / "rows"),
                            "hostile_names": hostile_names(tmp / "names")}
    rb = payload["read_back"]
    print(f"  pending: {rb['pending']['lines']} bad lines, quarantined {rb['pending']['quarantined']}, crashes "
          f"{rb['pending']['crashes']}; stored rows crashes {rb['stored_rows']['crashes']}; names escaped "
          f"{rb['hostile_names']['escaped']}")


def _concurrency_section(payload: dict[str, Any], tmp: Path, quick: bool,
                         no_postgres: bool) -> tuple[str | None, str]:
    """payload["postgresql_skipped"] (when it is), ["concurrent"] and ["store_throughput"]: 4 workers
    on one campaign and one store, on SQLite and on PostgreSQL. Returns (the PostgreSQL URL or None,
    why it is None), which the later sections run on."""
    backends: dict[str, tuple[str, str] | None] = {"sqlite": (f"sqlite:///{tmp}/conc-campaigns.db",
                                                              f"sqlite:///{tmp}/conc-trials.db")}
    pg_url, why = (None, "--no-postgres") if no_postgres else start_postgres()
    if pg_url:
        backends["postgresql"] = (fresh_postgres_database(pg_url), fresh_postgres_database(pg_url))
    else:
        payload["postgresql_skipped"] = why
        print(f"  PostgreSQL skipped: {why}")
    payload["concurrent"], payload["store_throughput"] = {}, {}
    from cubic.core.store import redact_url

    for backend, (storage, store) in backends.items():
        print(f"concurrent workers on {backend} ...", flush=True)
        cw = concurrent_workers(storage, store, workers=4, budget=40 if quick else 120, kill_one=True)
        payload["concurrent"][backend] = cw
        tp = store_throughput(store, workers=4, per_worker=25 if quick else 150)
        tp["url"] = redact_url(store)
        payload["store_throughput"][backend] = tp
        print(f"  4 workers: trials {cw['trials']}/{cw['budget']}, lost {cw['lost_trials']}, duplicated "
              f"{cw['duplicated_trials']}, locked {cw['database_is_locked_failures']}, campaign "
              f"{cw['campaign_trials_per_s']} trials/s; store writes {tp['trials_per_s']} trials/s")
    return pg_url, why


def _first_start_section(payload: dict[str, Any], tmp: Path, pg_url: str | None, quick: bool) -> None:
    """payload["first_start"]: processes released at one instant on a new storage and store, per backend."""
    payload["first_start"] = {}
    for backend in ("sqlite", "postgresql") if pg_url else ("sqlite",):
        base = pg_url if backend == "postgresql" else None
        print(f"first start on {backend} ...", flush=True)
        fo = first_open(tmp / f"first-{backend}", tries=20, processes=3, pg_base=base)  # the issue's 20, cheap
        fs = first_start(tmp / f"firstcli-{backend}", tries=1 if quick else 3, pg_base=base)
        payload["first_start"][backend] = {"opens": fo, "commands": fs}
        print(f"  {fo['tries']} tries x {fo['processes_per_try']} opens: {fo['failures']} failures; "
              f"{fs['tries']} tries x {fs['processes_per_try']} commands: {fs['failures']} failures")


def _fuzz_section(payload: dict[str, Any], tmp: Path, n_fuzz: int) -> dict[str, Any]:
    """payload["fuzz"]: ``n_fuzz`` generated bad inputs per parser target (fewer per CLI target)."""
    print(f"fuzz: {n_fuzz} inputs per target ...", flush=True)
    t0 = time.monotonic()
    stats = fuzz(tmp / "fuzz", examples=n_fuzz, targets=("workload", "csv", "space", "config", "plan", "placement"))
    fz = fuzz(tmp / "fuzz", examples=max(10, n_fuzz // 3), stats=stats, targets=("cli", "cli-other")).to_json()  # a CLI call costs more
    fz["elapsed_s"] = round(time.monotonic() - t0, 1)
    payload["fuzz"] = fz
    print(f"  inputs {fz['inputs_tried']}, uncaught {fz['uncaught_exceptions']}, partial writes "
          f"{fz['partial_writes']}")
    for ex in fz["uncaught_examples"][:5]:
        print(f"    {ex['target']}: {ex['error'][:160]}")
    return fz


def _input_attacks_section(payload: dict[str, Any], quick: bool) -> dict[str, Any]:
    """payload["input_attacks"]; returns the full per-class result, for the targets."""
    # the input attack classes (bounded inputs, timeouts, secrets, stray code, tracebacks, messages,
    # terminal escapes): experiments/reliability_inputs.py, run here too so that one file has every target
    from experiments import reliability_inputs

    from experiments.common import run_context

    t_in, ctx = time.monotonic(), run_context("measured")
    inputs = reliability_inputs.run(quick)
    reliability_inputs.write(inputs, quick, time.monotonic() - t_in, ctx)
    payload["input_attacks"] = {"classes": inputs["classes"], "total": inputs["total"]}
    return inputs


def _summary(payload: dict[str, Any], survived: dict[str, Any], kr: dict[str, Any],
             fz: dict[str, Any]) -> dict[str, Any]:
    """The headline figures: faults, kills, trials lost and duplicated, throughput, fuzz."""
    return {
        "faults_injected_by_kind": {k: v["recorded_as"] for k, v in survived.items()},
        "faults_survived": payload["faults"]["campaign_went_on"],
        "kills_survived": kr["kills"] if kr["lost_trials"] == 0 and kr["duplicated_trials"] == 0 else 0,
        "trials_lost": kr["lost_trials"] + kr["store"]["lost"] + sum(c["lost_trials"] + c["store"]["lost"]
                                                                     for c in payload["concurrent"].values()),
        "duplicates": kr["duplicated_trials"] + kr["store"]["duplicates"] + sum(
            c["duplicated_trials"] + c["store"]["duplicates"] for c in payload["concurrent"].values()),
        "store_trials_per_s_4_workers": {b: t["trials_per_s"] for b, t in payload["store_throughput"].items()},
        "campaign_trials_per_s_4_workers": {b: c["campaign_trials_per_s"] for b, c in payload["concurrent"].items()},
        "fuzz_inputs": fz["inputs_tried"], "uncaught_exceptions": fz["uncaught_exceptions"],
        "partial_writes": fz["partial_writes"],
    }


def _targets(payload: dict[str, Any], inputs: dict[str, Any], kr: dict[str, Any], kills: int) -> dict[str, Any]:
    """The targets of the inputs, kills, concurrency, faults and fuzz sections (reads payload["summary"]);
    a missed one carries a reason."""
    sm, it = payload["summary"], inputs["total"]
    kill_ok = kr["lost_trials"] == 0 and kr["duplicated_trials"] == 0
    # the input attack classes tried, plus kills, concurrency, faults and fuzz
    classes = sum(1 for c in inputs["classes"].values() if c["variants"]) + 4
    targets = {
        "attack classes tried (inputs, kills, concurrency, faults, fuzz)": {
            "measured": classes, "target": ">= 11", "met": classes >= 11},
        "input attack variants tried": {"measured": it["variants"], "target": ">= 2 per class",
                                        "met": all(c["variants"] >= 2 for c in inputs["classes"].values())},
        "defects (input attacks)": {"measured": it["defects"], "target": 0, "met": it["defects"] == 0},
        "data lost (trials lost + input attacks)": {"measured": sm["trials_lost"] + it["data_lost"], "target": 0,
                                                    "met": sm["trials_lost"] + it["data_lost"] == 0},
        "duplicated trials": {"measured": sm["duplicates"], "target": 0, "met": sm["duplicates"] == 0},
        "uncaught exceptions (fuzz + input attacks)": {
            "measured": sm["uncaught_exceptions"] + it["uncaught_exceptions"], "target": 0,
            "met": sm["uncaught_exceptions"] + it["uncaught_exceptions"] == 0},
        "hangs (input attacks)": {"measured": it["hangs"], "target": 0, "met": it["hangs"] == 0},
        "partial writes (fuzz)": {"measured": sm["partial_writes"], "target": 0, "met": sm["partial_writes"] == 0},
        "kills survived without loss": {"measured": kr["kills"] if kill_ok else 0, "target": kills,
                                        "met": kill_ok and kr["kills"] >= kills},
    }
    thin = sorted(n for n, c in inputs["classes"].items() if c["variants"] < 2)
    where = {  # a missed target names the section of this JSON that holds its cases
        "input attack variants tried": f"classes with fewer than 2 variants: {thin}",
        "attack classes tried (inputs, kills, concurrency, faults, fuzz)": f"input classes with no variant: {thin}",
        "partial writes (fuzz)": "see fuzz", "uncaught exceptions (fuzz + input attacks)": "see fuzz.uncaught_examples "
        "and inputs", "kills survived without loss": f"see kills: {kr['lost_trials']} lost, {kr['duplicated_trials']} "
        "duplicated"}
    for k, t in targets.items():
        t["met"] = bool(t["met"])
        if not t["met"]:
            t["reason"] = where.get(k, "see summary and the inputs/kills/concurrent sections")
    return targets


def _cluster_faults(pg_url: str | None, why: str) -> dict[str, Any]:
    """Issue 27 point 3 on PostgreSQL (where workers on other hosts are): a worker that stops
    heartbeating (SIGSTOP) and a server restart mid-campaign (a server of its own, port 55433)."""
    out: dict[str, Any] = {}
    print("cluster faults: a Ray worker node lost mid-run ...", flush=True)
    try:
        import tempfile

        from experiments.reliability.faults import ray_node_lost

        out["ray_node_lost"] = ray_node_lost(tempfile.mkdtemp(prefix="cubic-ray-"))
    except ImportError as e:
        out["ray_node_lost"] = {"skipped": f"Ray is not installed: {e}"}
    if not pg_url:
        return {**out, "skipped": why}
    print("cluster faults on postgresql: a stalled worker ...", flush=True)
    out["stall"] = concurrent_workers(fresh_postgres_database(pg_url), fresh_postgres_database(pg_url), workers=3,
                                      budget=12, delay_s=1.0, lease_s=5.0, fault="stall", timeout_s=300)
    print("cluster faults on postgresql: a server restart ...", flush=True)
    with private_postgres(55433, "restart") as pg:
        if pg.url is None:
            out["db_restart"] = {"skipped": pg.why}
        else:
            out["db_restart"] = concurrent_workers(
                fresh_postgres_database(pg.url), fresh_postgres_database(pg.url), workers=3, budget=12,
                delay_s=1.0, lease_s=5.0, fault="db_restart", timeout_s=300, restart_db=pg.restart)
    return out


def _soak(pg_url: str | None, why: str, quick: bool) -> dict[str, Any]:
    """Issue 27 point 6: 8 workers on PostgreSQL, kills and a server restart (a server of its own);
    the proposal time of cubic's search at 100 / 1,000 / 10,000 trials."""
    from experiments.reliability.soak import proposal_scaling, soak

    out: dict[str, Any] = {}
    budget, kills = (200, 3) if quick else (1000, 10)
    if not pg_url:
        out["campaign"] = {"skipped": why}
    else:
        with private_postgres(55434, "soak") as pg:
            if pg.url is None:
                out["campaign"] = {"skipped": pg.why}
            else:
                print(f"soak: 8 workers, {budget} trials, {kills} kills, a server restart ...", flush=True)
                out["campaign"] = soak(fresh_postgres_database(pg.url), fresh_postgres_database(pg.url),
                                       workers=8, budget=budget, kills=kills, restart_db=pg.restart)
    print("proposal time at 100 / 1,000 / 10,000 trials ...", flush=True)
    out["proposal_time"] = proposal_scaling((100, 1000, 10000), timeout_s=300.0 if quick else 900.0)
    return out


def _race_why(fs: dict[str, Any]) -> str:
    """A missed first-start target's reason: which processes failed, and their last error line."""
    out = []
    for backend, b in fs.items():
        for part in ("opens", "commands"):
            for d in b[part]["details"]:
                last = (d.get("stderr") or d.get("error") or "").strip().splitlines()[-1:] or [""]
                out.append(f"{backend} {part}, try {d['try']}: {d.get('command') or d.get('kind')} exit {d['rc']}: "
                           f"{last[0][:200]}")
    return "; ".join(out) or "failures without details"


def _fault_target(cf: dict[str, Any], key: str, t, target: str):
    r = cf.get(key) or {}
    if "skipped" in cf or "skipped" in r or not r:
        return t(None, target, False, f"not run: {cf.get('skipped') or r.get('skipped') or 'no figure'}")
    keys = ("trials", "budget", "lost_trials", "duplicated_trials", "reattached_workers", "lost_runs_not_told",
            "lost_takes", "worker_exit_codes")
    measured = {k: r[k] for k in keys if k in r} | {"fault": r["fault"], "store": r["store"]}
    problems = fault_outcome_problems(r)
    return t(measured, target, not problems, f"see cluster_faults.{key}" + (
        f"; broken: {', '.join(problems)}" if problems else ""))


def _ray_target(cf: dict[str, Any], t):
    r = cf.get("ray_node_lost") or {"skipped": "not run"}
    target = "the run retried on another node, the trial the configuration's success"
    if "skipped" in r:
        return t(None, target, False, f"not run: {r['skipped']}")
    ok = r["run_reached_the_node"] and r["states"] == ["COMPLETE", "COMPLETE"] and r["attempts"][0] == 2
    return t(r, target, ok, "see cluster_faults.ray_node_lost")


def _soak_target(sk: dict[str, Any], t):
    c = sk.get("campaign") or {"skipped": "not run"}
    if "skipped" in c:
        return t(None, ">= 1000 trials, 0 lost", False, f"not run: {c['skipped']}")
    ok = (c["finished_runs"] == c["budget"] >= 1000 and c["lost_trials"] == c["duplicated_points"] == 0
          and c["failed_without_a_run"] == 0 and c["store"]["lost"] == 0 and c["kills"] >= 1 and c["db_restarts"] == 1)
    measured = {k: c[k] for k in ("workers", "budget", "finished_runs", "lost_trials", "duplicated_points",
                                  "failed_without_a_run", "kills", "db_restarts", "campaign_trials_per_s", "wall_s")}
    why = ("the quick form runs 200 trials" if c["budget"] < 1000 else "see soak.campaign")
    return t(measured, ">= 1000 trials, 0 lost, 0 duplicated", ok, why)


def _issue27_targets(payload: dict[str, Any], kr: dict[str, Any], kc: dict[str, Any]) -> dict[str, Any]:
    """Issue 27: kills as a user sees them, first starts, read-back attacks; what was not reached."""
    def t(measured, target, met, reason=None):
        out = {"measured": measured, "target": target, "met": bool(met)}
        if not met:
            out["reason"] = reason or "missed"
        return out

    views = [kr["user_view"], kc["user_view"]]
    extra = sum(v["trials"] for v in views) - kr["budget"] - kc["budget"]
    dup = sum(v["duplicated_points"] for v in views)
    fails = sum(v["failed_without_a_run"] for v in views)
    fs = payload["first_start"]
    races = sum(b["opens"]["failures"] + b["commands"]["failures"] for b in fs.values())
    tries = {b: v["opens"]["tries"] for b, v in fs.items()}
    rb = payload["read_back"]
    crashes = rb["pending"]["crashes"] + rb["stored_rows"]["crashes"] + rb["hostile_names"]["crashes"]
    cf = payload.get("cluster_faults") or {"skipped": "not run"}
    return {
        "kills survived, study holding exactly the budget (stand-in + real CLI)": t(
            kr["kills"] + kc["kills"] if extra == 0 else 0, kr["kills"] + kc["kills"], extra == 0,
            f"{extra} trials beyond the budget in the studies"),
        "duplicated points in the study (trials_dataframe)": t(dup, 0, dup == 0),
        "FAIL trials a kill made (no run)": t(fails, 0, fails == 0),
        "lost results (study and store)": t(kr["lost_trials"] + kr["store"]["lost"], 0,
                                            kr["lost_trials"] + kr["store"]["lost"] == 0),
        "first-start races (processes released at one instant, new storage and store)": t(
            races, 0, races == 0 and all(n >= 20 for n in tries.values()) and "postgresql" in tries,
            f"tries per backend {tries} (target 20 each, SQLite and PostgreSQL)" if races == 0 else _race_why(fs)),
        "read-back attacks: malformed pending lines (kinds)": t(rb["pending"]["lines"], ">= 20",
                                                                rb["pending"]["lines"] >= 20),
        "read-back attacks: corrupt stored rows (kinds)": t(len(rb["stored_rows"]["kinds"]), ">= 5",
                                                            len(rb["stored_rows"]["kinds"]) >= 5),
        "read-back attacks: hostile campaign names": t(len(rb["hostile_names"]["names"]), ">= 5",
                                                       len(rb["hostile_names"]["names"]) >= 5),
        "read-back crashes": t(crashes, 0, crashes == 0),
        "rows imported unchecked": t(rb["pending"]["rows_imported_unchecked"], 0,
                                     rb["pending"]["rows_imported_unchecked"] == 0),
        "names escaping .cubic/": t(rb["hostile_names"]["escaped"], 0, rb["hostile_names"]["escaped"] == 0),
        "bad pending lines quarantined with a warning naming file and line": t(
            rb["pending"]["warnings_naming_file_and_line"], rb["pending"]["lines"],
            rb["pending"]["warnings_naming_file_and_line"] == rb["pending"]["quarantined"] == rb["pending"]["lines"]),
        "Ray worker node lost mid-run": _ray_target(payload.get("cluster_faults") or {}, t),
        "PostgreSQL restarted mid-campaign (stand-in runs, 3 workers)": _fault_target(
            cf, "db_restart", t, "workers wait and re-attach, nothing lost"),
        "a worker stops heartbeating (SIGSTOP, PostgreSQL)": _fault_target(
            cf, "stall", t,
            "retired after the grace period, re-run once, told once, the stalled worker goes on (its attempt "
            "reported lost, or re-attached when stopped inside a transaction the server then ended)"),
        "soak (8 workers, PostgreSQL, >= 1000 trials, kills, a restart)": _soak_target(payload.get("soak") or {}, t),
    }


def _plot(payload: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tp = payload["store_throughput"]
    axes[0].bar(list(tp), [t["trials_per_s"] for t in tp.values()], color=["#4477aa", "#cc6677"][: len(tp)])
    axes[0].set_ylabel("trials/s (MEASURED)")
    axes[0].set_title("trial store writes, 4 processes")
    fz = payload["fuzz"]
    names = sorted(fz["tried"])
    axes[1].bar(names, [fz["clear_errors"].get(n, 0) for n in names], label="clear error")
    axes[1].bar(names, [fz["accepted"].get(n, 0) for n in names],
                bottom=[fz["clear_errors"].get(n, 0) for n in names], label="accepted")
    axes[1].set_title(f"fuzz (MEASURED): {fz['inputs_tried']} inputs, {fz['uncaught_exceptions']} uncaught")
    axes[1].legend()
    axes[1].tick_params(axis="x", rotation=30)
    fig.suptitle(f"kills survived {payload['summary']['kills_survived']}, trials lost "
                 f"{payload['summary']['trials_lost']}, duplicates {payload['summary']['duplicates']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
