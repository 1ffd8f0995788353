"""Reliability under hostile inputs: every bad input is one clean line, bounded in time and memory.

    .venv/bin/python experiments/reliability_inputs.py [--quick]

Attack classes (project issue 16), each with several variants, every one through the real
``cubic`` command in a child process (memory-capped, time-limited, its own working directory):

- hangs: database URLs pointing at a loopback server that accepts and never answers;
- secrets: passwords with "@", "/", ":" in store/storage URLs (CLI and worker) must not be printed;
- stray code: a ``json.py``/``random.py`` in the working directory must not be imported by a run;
- unbounded inputs: YAML alias bombs, deep nesting, oversized files, huge numeric ranges in spaces,
  plans and flags sized beyond the machine;
- tracebacks: foreign or mismatched campaign storage, a trial store as campaign storage (and back:
  allowed, one URL may hold both), a full disk (a store error, exit 3), an over-long campaign name;
- messages: over-long integers, a corrupt stored row (must be skipped, the rest still listed and
  exported), a plan with batch 1e30 -- each message names the file/field/row;
- escapes: terminal control sequences in workload and table names must not reach the terminal raw;
- file values: a value in a workload, config, plan, placement or space file that no run can use
  (a table width FBGEMM refuses, NaN, an unknown device, a missing calibration, a group that does not
  divide the ranks, a placement for another model, a space value such as batch 0): named, nothing recorded;
- traces: a command that only reads, or is refused, leaves no file behind (a mistyped --storage or
  --store, a refused report's folder, a --save folder that does not exist, an export to a name it
  cannot write, a trial store given as the campaign storage);
- flags: a value past its field's bound, or a flag that would change nothing, is refused as the flag
  typed before any run (counts of steps, repeats, workers, GPUs; a stray brace in --objective);
- environment: a bad value in a variable cubic reads (a database timeout, the campaign storage, the
  data folder) is named as the variable, before any work, leaving nothing behind;
- job loaders (``experiments/reliability/job_attacks.py``): a user's TorchRec job (``_plan_job.py``,
  not the CLI) loads a plan that does not fit its model (the collection's path, a table either side lacks, rows, dim):
  refused in one line before DMP, never run with the tables unsharded or failed deep in TorchRec; a
  user's torchao job (``_fp8_job.py``) applies a placement with its own calls through
  ``module_filter_fn`` (a wrapped model, another shape, one call for three recipes, Mods, block128):
  refused in one line, never converting other modules, none, or in another recipe; a user's Optuna
  study (``_optuna_job.py``) with parameters Optuna takes and a cubic space does not hold as they are
  (a None choice, an int range past 2**53, a tiny float step, a long name): every trial completes.

A variant passes when the command ends within its limit, without a traceback, with the expected
exit code and (for bad input) exactly one ``cubic: ...`` line on stderr that says what it must,
with nothing forbidden (a secret, a raw ESC) in its output, with no stored row lost, and (for bad
input) no row recorded (``experiments/reliability/attack.py`` runs and judges one attack).
Writes results/reliability_inputs.json with ``targets``.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments.reliability.attack import CLI, WORKER, Attack, Outcome, run_attack, write_file  # noqa: E402
from experiments.reliability.job_attacks import job_loader_attacks  # noqa: E402

ESC = "\x1b"


# -- helpers for the attacks ----------------------------------------------------------------------

from cubic.testing import silent_server  # noqa: E402  (shared with the tests)


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def toy_workload(name: str = "toy", **over: Any) -> dict[str, Any]:
    doc = {"version": 1, "name": name, "batch_size": 64,
           "tables": [{"name": "t0", "rows": 1000, "dim": 16, "pooling_factor": 2.0}],
           "dense_arch": {"kind": "dlrm", "bottom_mlp": [32, 16], "top_mlp": [32, 1]},
           "data": {"num_dense_features": 4, "eval_batch_size": 64}}
    doc.update(over)
    return doc


def _plan_doc(world: int, batch: int) -> dict[str, Any]:
    from cubic.core.spec import Table, Topology

    t = Table(name="t0", rows=1000, dim=16)
    return {"version": 1, "planner": "hand", "world_size": world, "group_size": world, "batch_size": batch,
            "topology": Topology(world_size=1).model_dump(mode="json"),
            "tables": [t.model_dump(mode="json")],
            "shards": [{"table": "t0", "sharding_type": "table_wise", "rank": 0, "rows": 1000, "cols": 16,
                        "row_offset": 0, "col_offset": 0}]}


def _trial_rows(db: str) -> Callable[[Path], int]:
    def count(wd: Path) -> int:
        p = wd / db
        if not p.exists():
            return 0
        with sqlite3.connect(p) as c:
            try:
                return int(c.execute("SELECT count(*) FROM cubic_trials").fetchone()[0])
            except sqlite3.Error:
                return 0
    return count


def _seed_store(wd: Path, n: int = 3, corrupt: int | None = None, name: str = "toy") -> None:
    """A trial store with ``n`` simulated trials (fast), one of them corrupted in place if asked."""
    from cubic.core.config import Config
    from cubic.core.spec import Workload
    from cubic.core.store import TrialStore
    from cubic.runners.sim import SimulatedRunner

    w = Workload.model_validate(toy_workload(name))
    runner = SimulatedRunner.from_spec("h100x8")
    with TrialStore(f"sqlite:///{wd / 'store.db'}") as store:
        for seed in range(n):
            cfg = Config(seed=seed)
            store.record(w, cfg, runner.run(w, cfg, steps=2, warmup=0))
    if corrupt is not None:
        with sqlite3.connect(wd / "store.db") as c:
            c.execute("UPDATE cubic_trials SET result = '{not json' WHERE id = ?", (corrupt,))


def _optuna_storage(wd: Path, name: str, mutate: Callable[[sqlite3.Connection], None] | None = None) -> str:
    import optuna

    url = f"sqlite:///{wd / name}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.storages.RDBStorage(url)
    if mutate:
        with sqlite3.connect(wd / name) as c:
            mutate(c)
    return url


# -- the attacks ----------------------------------------------------------------------------------

def _hang_attacks(port: int) -> list[Attack]:
    """Hangs: database URLs at a loopback server that accepts and never answers."""
    pg = f"postgresql+psycopg2://u:pw@127.0.0.1:{port}/db"
    out: list[Attack] = []
    A = out.append

    # hangs: a server that accepts and never answers
    A(Attack("hangs", "trials list --store silent postgres", ["trials", "list", "--store", pg],
             must_say=("--store", "timeout"), forbid=("pw@",), timeout_s=30, quick=True))
    A(Attack("hangs", "campaign list --storage silent postgres", ["campaign", "list", "--storage", pg],
             must_say=("storage", "timeout"), timeout_s=30))
    A(Attack("hangs", "trials export --store silent postgres",
             ["trials", "export", "--out", "x.csv", "--store", pg], must_say=("timeout",), timeout_s=30))
    A(Attack("hangs", "worker --storage silent postgres",
             ["run", "--storage", pg, "--name", "x", "--evaluate", "evalmod:make"], program=WORKER,
             setup=lambda d: write_file(d / "evalmod.py", "def make(**kw):\n    return lambda p: {'y': 1.0}\n"),
             must_say=("timeout",), timeout_s=30))
    return out


def _secret_attacks() -> list[Attack]:
    """Secrets: store/storage URLs whose passwords must not be printed (CLI and worker)."""
    out: list[Attack] = []
    A = out.append

    # secrets: a password SQLAlchemy would split into a host or database
    for i, (pw, secret) in enumerate([("a@TopSecretPart/x9", "TopSecretPart"), ("S3cr3tWord@x", "S3cr3tWord"),
                                      ("p:Hidd3nBit@q", "Hidd3nBit"), ("z/Conf1dential#", "Conf1dential")]):
        url = f"postgresql+psycopg2://bob:{pw}@127.0.0.1:1/db"
        A(Attack("secrets", f"trials list --store password {i}", ["trials", "list", "--store", url],
                 forbid=(secret,), quick=i == 0))
        A(Attack("secrets", f"campaign list --storage password {i}", ["campaign", "list", "--storage", url],
                 forbid=(secret,)))
    A(Attack("secrets", "worker --storage password", ["run", "--storage",
             "postgresql+psycopg2://bob:a@TopSecretPart/x9@127.0.0.1:1/db", "--name", "x", "--evaluate",
             "evalmod:make"], program=WORKER,
             setup=lambda d: write_file(d / "evalmod.py", "def make(**kw):\n    return lambda p: {'y': 1.0}\n"),
             forbid=("TopSecretPart",)))
    return out


def _stray_code_attacks() -> list[Attack]:
    """Stray code: a json.py/random.py in the working directory of a run."""
    out: list[Attack] = []
    A = out.append

    # stray code: modules in the working directory must not be imported by a run's child
    for mod in ("json", "random"):
        A(Attack("stray code", f"{mod}.py in the cwd of cubic run",
                 ["run", "--workload", "dlrm-small", "--steps", "1", "--warmup", "0", "--threads", "1",
                  "--store", "sqlite:///store.db", "--force"],
                 setup=lambda d, m=mod: write_file(d / f"{m}.py", "open('STRAY_RAN', 'w').write('x')\n"
                                                              "raise SystemExit('stray module imported')\n"),
                 expect_rc=(0,), one_line=False, forbid=("stray module imported",), timeout_s=240,
                 quick=mod == "json"))
    return out


def _unbounded_file_attacks() -> list[Attack]:
    """Unbounded inputs in files: YAML alias bombs, recursion, deep nesting, an oversized file."""
    out: list[Attack] = []
    A = out.append

    # unbounded inputs
    A(Attack("unbounded", "alias bomb in --config", ["run", "--workload", "dlrm-small", "--config", "bomb.yaml",
             "--store", "sqlite:///store.db"], setup=lambda d: write_file(d / "bomb.yaml", alias_bomb()),
             must_say=("bomb.yaml", "expands"), quick=True))
    A(Attack("unbounded", "alias bomb in a workload", ["workloads", "show", "wl.yaml"],
             setup=lambda d: write_file(d / "wl.yaml", alias_bomb() + "name: x\n"), must_say=("wl.yaml",)))
    A(Attack("unbounded", "alias bomb under probe: in a placement",
             ["fp8", "check", "--workload", "dlrm-small", "--placement", "pl.yaml", "--steps", "1"],
             setup=lambda d: write_file(d / "pl.yaml", "version: 1\nprobe:\n" + "".join(
                 "  " + ln + "\n" for ln in alias_bomb().splitlines())), must_say=("pl.yaml", "probe")))
    A(Attack("unbounded", "recursive alias", ["workloads", "show", "rec.yaml"],
             setup=lambda d: write_file(d / "rec.yaml", "name: &n x\ntables: &t [*t]\n"), must_say=("rec.yaml",)))
    A(Attack("unbounded", "nesting 10000 deep", ["workloads", "show", "deep.json"],
             setup=lambda d: write_file(d / "deep.json", "[" * 10000 + "]" * 10000), must_say=("deep.json",)))
    A(Attack("unbounded", "33 MiB workload", ["workloads", "show", "big.yaml"],
             setup=lambda d: write_file(d / "big.yaml", "# " + "x" * (33 * 2**20) + "\n"), must_say=("big.yaml",)))
    return out


def _unbounded_size_attacks() -> list[Attack]:
    """Unbounded inputs in sizes: huge ranges in spaces, plans and flags beyond the machine."""
    out: list[Attack] = []
    A = out.append

    space_head = "version: 1\nname: s\nparameters:\n"
    for v, param in [("int high 1e21", "{name: batch_size, type: int, low: 1, high: 1e21}"),
                     ("int high 1e300 log", "{name: batch_size, type: int, low: 1, high: 1e300, log: true}"),
                     ("float step 1e-300", "{name: fp8.budget_sqnr_db, type: float, low: 1, high: 40, step: 1e-300}"),
                     ("infinite bound", "{name: batch_size, type: int, low: 1, high: .inf}"),
                     ("int step 0.5", "{name: batch_size, type: int, low: 1, high: 100, step: 0.5}")]:
        expect = (2,)
        A(Attack("unbounded", f"space {v}",
                 ["campaign", "run", "--workload", "dlrm-small", "--space", "space.yaml", "--name", "s",
                  "--simulate", "h100x8", "--budget", "2", "--batch", "2", "--storage", "sqlite:///c.db",
                  "--store", "sqlite:///store.db", "--json"],
                 setup=lambda d, p=param: write_file(d / "space.yaml", space_head + f"  - {p}\n"),
                 expect_rc=expect, one_line=expect == (2,), must_say=() if expect == (0,) else ("space.yaml",),
                 timeout_s=180))
    A(Attack("unbounded", "realistic two-int space is accepted",
             ["campaign", "run", "--workload", "wukong-small", "--space", "space.yaml", "--name", "two",
              "--simulate", "h100x8", "--budget", "2", "--batch", "2", "--storage", "sqlite:///c.db",
              "--store", "sqlite:///store.db", "--json"],
             setup=lambda d: write_file(d / "space.yaml", space_head + "  - {name: batch_size, type: int, low: 256, "
                                    "high: 65536}\n  - {name: model.mlp_width, type: int, low: 64, high: 4096}\n"),
             expect_rc=(0,), one_line=False, timeout_s=180))
    for v, world, batch in [("world 1e12", 10**12, 64), ("batch 1e12", 1, 10**12)]:
        A(Attack("unbounded", f"shard evaluate plan {v}", ["shard", "evaluate", "plan.json", "--repeats", "1"],
                 setup=lambda d, w=world, b=batch: write_file(d / "plan.json", json.dumps(_plan_doc(w, b))),
                 must_say=("plan.json",)))
    A(Attack("unbounded", "shard evaluate plan batch 1e7 x group (memory)",
             ["shard", "evaluate", "plan.json", "--repeats", "1"],
             setup=lambda d: write_file(d / "plan.json", json.dumps(
                 {**_plan_doc(1, 10_000_000), "tables": [{"name": "t0", "rows": 1000, "dim": 4096,
                                                          "pooling_factor": 10000.0}],
                  "shards": [{"table": "t0", "sharding_type": "table_wise", "rank": 0, "rows": 1000,
                              "cols": 4096, "row_offset": 0, "col_offset": 0}]})),
             must_say=("plan.json", "memory")))
    A(Attack("unbounded", "shard plan --batch-size 1e15",
             ["shard", "plan", "--tables", "dlrm-small", "--world-size", "2", "--memory-gb", "8", "--batch-size",
              "1000000000000000", "--out", "p.json"], one_line=False, must_say=("--batch-size",), quick=True))
    A(Attack("unbounded", "shard plan --world-size 1e12",
             ["shard", "plan", "--tables", "dlrm-small", "--world-size", "1000000000000", "--memory-gb", "8"],
             one_line=False, must_say=("--world-size",)))
    A(Attack("unbounded", "fp8 kernels 1e6^3", ["fp8", "kernels", "--m", "1000000", "--k", "1000000", "--n",
             "1000000"], must_say=("--m/--k/--n", "memory"), quick=True))
    return out


def _traceback_attacks() -> list[Attack]:
    """Tracebacks: foreign or mismatched storage, a full disk, an over-long campaign name."""
    out: list[Attack] = []
    A = out.append

    # tracebacks: storage that is something else, a full disk, a long name
    A(Attack("tracebacks", "campaign storage of another Optuna version", ["campaign", "list", "--storage",
             "sqlite:///old.db"], setup=lambda d: _optuna_storage(d, "old.db", lambda c: c.execute(
                 "UPDATE version_info SET schema_version = 99, library_version = '9.9.9'")),
             must_say=("9.9.9",), quick=True))
    A(Attack("tracebacks", "foreign studies table", ["campaign", "list", "--storage", "sqlite:///foreign.db"],
             setup=lambda d: sqlite3.connect(d / "foreign.db").execute("CREATE TABLE studies (x INTEGER)"),
             must_say=("studies",)))
    # one database URL may hold both (cubic's tables are cubic_*, issue 12): the other's tables are
    # left alone and the command works, exit 0, and the stored trials survive
    A(Attack("tracebacks", "trial store as campaign storage", ["campaign", "list", "--storage",
             "sqlite:///store.db"], setup=lambda d: _seed_store(d, 1), expect_rc=(0,), one_line=False,
             rows=_trial_rows("store.db")))
    A(Attack("tracebacks", "campaign storage as trial store", ["trials", "list", "--store", "sqlite:///old.db"],
             setup=lambda d: _optuna_storage(d, "old.db"), expect_rc=(0,), one_line=False))
    A(Attack("tracebacks", "full disk under --storage",
             ["campaign", "run", "--workload", "dlrm-small", "--name", "full", "--simulate", "h100x8", "--budget",
              "8", "--batch", "2", "--storage", "sqlite:///full.db", "--store", "sqlite:///store.db"],
             setup=lambda d: _seed_store(d, 1), fsize_limit=140_000, expect_rc=(3,), must_say=("disk",),
             rows=_trial_rows("store.db"), timeout_s=180))
    A(Attack("tracebacks", "250-character campaign name",
             ["campaign", "run", "--workload", "dlrm-small", "--name", "n" * 250, "--simulate", "h100x8",
              "--budget", "1", "--storage", "sqlite:///c.db", "--store", "sqlite:///store.db"], one_line=False,
             must_say=("--name", "193")))
    return out


def _message_attacks() -> list[Attack]:
    """Messages: over-long integers, corrupt stored rows, a huge plan batch, each named."""
    out: list[Attack] = []
    A = out.append

    # messages that name what is wrong
    A(Attack("messages", "5000-digit integer in a JSON workload", ["workloads", "show", "w.json"],
             setup=lambda d: write_file(d / "w.json", json.dumps(toy_workload()).replace('"rows": 1000',
                                                                                       '"rows": ' + "9" * 5000)),
             must_say=("w.json", "tables.0.rows"), quick=True))
    A(Attack("messages", "5000-digit integer in a YAML workload", ["workloads", "show", "w.yaml"],
             setup=lambda d: write_file(d / "w.yaml", "name: x\nbatch_size: " + "9" * 5000 + "\n"),
             must_say=("w.yaml", "batch_size")))
    A(Attack("messages", "corrupt stored row: trials list", ["trials", "list", "--store", "sqlite:///store.db",
             "--json"], setup=lambda d: _seed_store(d, 3, corrupt=2), expect_rc=(0,), one_line=False,
             must_say=("trial 2",), rows=_trial_rows("store.db"), quick=True))
    A(Attack("messages", "corrupt stored row: trials export", ["trials", "export", "--out", "t.csv", "--store",
             "sqlite:///store.db"], setup=lambda d: _seed_store(d, 3, corrupt=3), expect_rc=(0,), one_line=False,
             must_say=("trial 3",), rows=_trial_rows("store.db")))
    A(Attack("messages", "corrupt stored row: trials show", ["trials", "show", "2", "--store",
             "sqlite:///store.db"], setup=lambda d: _seed_store(d, 3, corrupt=2), one_line=False,
             must_say=("trial 2",), rows=_trial_rows("store.db")))
    A(Attack("messages", "plan with batch 1e30", ["shard", "evaluate", "plan.json"],
             setup=lambda d: write_file(d / "plan.json", json.dumps(_plan_doc(1, 10**30))),
             must_say=("plan.json", "batch_size")))
    return out


def _escape_attacks() -> list[Attack]:
    """Escapes: terminal control sequences in workload and table names."""
    out: list[Attack] = []
    A = out.append

    # terminal escapes in untrusted names
    evil = f"evil{ESC}]0;pwned{ESC}\\{ESC}[2J"
    A(Attack("escapes", "workload name in cubic run (simulated)",
             ["run", "--workload", "w.json", "--simulate", "h100x8", "--steps", "2", "--warmup", "0", "--store",
              "sqlite:///store.db"], setup=lambda d: write_file(d / "w.json", json.dumps(toy_workload(evil))),
             expect_rc=(0,), one_line=False, forbid=(ESC,), quick=True))
    A(Attack("escapes", "workload name in trials list", ["trials", "list", "--store", "sqlite:///store.db"],
             setup=lambda d: _seed_store(d, 2, name=evil), expect_rc=(0,), one_line=False, forbid=(ESC,)))
    A(Attack("escapes", "table name in shard plan",
             ["shard", "plan", "--tables", "w.json", "--world-size", "2", "--memory-gb", "8", "--planner",
              "size_greedy"],
             setup=lambda d: write_file(d / "w.json", json.dumps(toy_workload(tables=[
                 {"name": evil, "rows": 1000, "dim": 16}]))), expect_rc=(0,), one_line=False, forbid=(ESC,)))
    A(Attack("escapes", "workload name in an error", ["run", "--workload", "w.json", "--simulate", "h100x8",
             "--store", "sqlite:///store.db"],
             setup=lambda d: write_file(d / "w.json", json.dumps(toy_workload(evil, tables=[
                 {"name": "a", "rows": 10, "dim": 4}, {"name": "a", "rows": 10, "dim": 4}]))), forbid=(ESC,)))
    return out


def _wl_file(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """dlrm-small as a workload file, one field changed."""
    from cubic.core.workloads import load_workload

    doc = load_workload("dlrm-small").model_dump(mode="json")
    edit(doc)
    write_file(path, json.dumps(doc))


def _dlrm_placement(d: Path, site: str, shape: tuple[int, int] | None) -> None:
    """A placement config whose one site is ``site`` (a site of dlrm-small's model with its shape
    changed, or a site it lacks)."""
    doc = {"workload": "dlrm-small", "module_filter": [site], "sites": {site: {
        "m": 512, "k": shape[0] if shape else 16, "n": shape[1] if shape else 16, "recipe": "tensorwise",
        "kernel": "scaled_mm_tensorwise", "safe": True}}}
    write_file(d / "c.json", json.dumps({"fp8": {"policy": "placement", "placement": doc}}))


def _file_value_attacks() -> list[Attack]:
    """File values: a value in a workload, config, plan, placement or space file that no run can use
    (stop 57's probe: each was a recorded failed run, a traceback, or named neither file nor field).
    Each must be one line naming the file and the field, exit 2, and nothing recorded."""
    out: list[Attack] = []
    store = ["--store", "sqlite:///store.db"]
    run2 = ["run", "--workload", "w.json", "--world-size", "2", "--steps", "2", "--warmup", "0", *store]

    def A(variant, argv, setup, must_say, quick=False):
        out.append(Attack("file values", variant, argv, setup=lambda d: (_seed_store(d, 1), setup(d)),
                          must_say=must_say, rows=_trial_rows("store.db"), quick=quick, timeout_s=120))

    def wl(edit):
        return lambda d: _wl_file(d / "w.json", edit)

    A("table dim FBGEMM refuses: cubic run --world-size 2", run2, wl(lambda w: w["tables"][0].update(dim=6)),
      ("w.json", "tables.0.dim", "multiple of 4"), quick=True)
    A("table dim FBGEMM refuses: shard plan",
      ["shard", "plan", "--tables", "w.json", "--world-size", "2", "--no-check"],
      wl(lambda w: w["tables"][0].update(dim=6)), ("w.json", "tables.0.dim"))
    A("NaN pooling factor", run2, wl(lambda w: w["tables"][0].update(pooling_factor=float("nan"))),
      ("w.json", "tables.0.pooling_factor", "finite"))
    A("unknown topology.device", run2, wl(lambda w: w["topology"].update(device="tpu")), ("w.json", "topology.device"))
    A("missing topology.comm_calibration", run2, wl(lambda w: w["topology"].update(comm_calibration="nope.json")),
      ("w.json", "topology.comm_calibration", "nope.json"))
    cfg = ["run", "--workload", "dlrm-small", "--steps", "2", "--warmup", "0", "--config", "c.yaml", *store]
    A("fp8 budget policy without budget_sqnr_db", cfg, lambda d: write_file(d / "c.yaml", "fp8: {policy: budget}\n"),
      ("c.yaml", "fp8.budget_sqnr_db"))
    A("group_size that does not divide --world-size", [*cfg, "--world-size", "4"],
      lambda d: write_file(d / "c.yaml", "sharding: {planner: greedy, group_size: 3}\n"),
      ("c.yaml", "sharding.group_size", "--world-size 4"))
    A("replica sync without a 2D group", [*cfg, "--world-size", "2"],
      lambda d: write_file(d / "c.yaml", "sharding: {planner: greedy, sync: weights}\n"), ("c.yaml", "sharding.sync"))
    A("placement for a site the model lacks", [*cfg[:-3], "c.json", *store],
      lambda d: _dlrm_placement(d, "dense.layers.0.lcb.proj", None), ("c.json", "fp8.placement.sites"))
    A("plan whose group does not divide its ranks", ["shard", "evaluate", "p.json"],
      lambda d: write_file(d / "p.json", json.dumps(_plan_doc(4, 64) | {"group_size": 3})), ("p.json", "group_size"))
    space = ("version: 1\nname: s\nobjectives: [{metric: examples_per_s}]\nparameters:\n"
             "  - {name: batch_size, type: categorical, choices: [512, 0]}\n")
    A("space value no run can use", ["campaign", "run", "--workload", "dlrm-small", "--name", "c", "--budget", "2",
                                     "--space", "s.yaml", "--storage", "sqlite:///c.db", *store],
      lambda d: write_file(d / "s.yaml", space), ("s.yaml", "parameters.0", "batch_size = 0"))
    return out


def _trace_attacks() -> list[Attack]:
    """Traces: a command that only reads, or is refused, leaves no file behind (stop 58's probe: a
    mistyped --storage or --store became an empty database and its folders; a report folder was
    made while parsing, so a refused command left it; an export wrote CSV under an .xlsx name;
    --save made its folders)."""
    out: list[Attack] = []
    A = out.append
    A(Attack("traces", "campaign list at a mistyped --storage",
             ["campaign", "list", "--storage", "sqlite:///typo/c.db"], expect_rc=(0,), one_line=False, absent=("typo",), quick=True))
    A(Attack("traces", "campaign resume at a mistyped --storage", ["campaign", "resume", "c", "--storage",
             "sqlite:///typo/c.db"], must_say=("typo/c.db",), absent=("typo",)))
    A(Attack("traces", "trials show at a mistyped --store", ["trials", "show", "1", "--store", "sqlite:///typo/s.db"],
             must_say=("--store", "typo/s.db"), absent=("typo",)))
    A(Attack("traces", "report of an unknown campaign into new folders", ["campaign", "report", "c", "--out",
             "a/b/r", "--storage", "sqlite:///c.db"], must_say=("c.db",), absent=("a", "c.db")))
    A(Attack("traces", "trials export to an .xlsx name", ["trials", "export", "--out", "t.xlsx", "--store",
             "sqlite:///store.db"], setup=lambda d: _seed_store(d, 1), must_say=("--out", "t.xlsx"),
             absent=("t.xlsx",), rows=_trial_rows("store.db")))
    A(Attack("traces", "sim calibrate --save in a folder that does not exist", ["sim", "calibrate", "--save",
             "no/p.json"], must_say=("--save",), absent=("no",)))
    # stop 59: Optuna's twelve tables were written into the trial store, and a lock file left beside it
    A(Attack("traces", "campaign dashboard at a trial store given as --storage", ["campaign", "dashboard", "c",
             "--port", "0", "--storage", "sqlite:///store.db"], setup=lambda d: _seed_store(d, 1),
             must_say=("--storage", "no campaign storage"), absent=("store.db.lock",), rows=_trial_rows("store.db")))
    return out


JOB_SPACE = ("version: 1\nname: s\nobjectives: [{metric: acc}]\nparameters:\n"
             "  - {name: lr, type: float, low: 0.001, high: 0.1}\n")


def _flag_attacks() -> list[Attack]:
    """Flags: a value past its field's bound, or a flag that would change nothing, is refused as the
    flag typed, before any run (stop 59's probe: pydantic's multi-part dump; a field's inner name
    instead of the flag; a failed trial recorded for --world-size 2000000; --steps 99999999999 and
    --workers 100000 running until killed; a stray brace reported as an unused parameter)."""
    out: list[Attack] = []
    store = ["--store", "sqlite:///store.db"]

    def A(variant, argv, must_say, setup=None, quick=False):
        out.append(Attack("flags", variant, argv, setup=lambda d: (_seed_store(d, 1), setup and setup(d)),
                          must_say=must_say, forbid=("validation error", "pydantic.dev"), rows=_trial_rows("store.db"),
                          quick=quick, timeout_s=60))

    def job(d: Path) -> None:
        write_file(d / "s.yaml", JOB_SPACE)
        write_file(d / "job.py", "import json; print(json.dumps({'acc': 0.5}))\n")

    A("sim scale --gpus past the world bound", ["sim", "scale", "--gpus", "8,99999999999"], ("--gpus",), quick=True)
    A("sim calibrate --batches past the batch bound", ["sim", "calibrate", "--cluster", "cpu", "--batches",
                                                       "99999999999"], ("--batches",))
    A("sim calibrate --factors unknown", ["sim", "calibrate", "--cluster", "cpu", "--factors", "nope"], ("--factors",))
    A("sim predict --simulate past the world bound", ["sim", "predict", "--simulate", "h100x99999999999"],
      ("--simulate",))
    A("sim scale --sync-interval with per-step gradient sync", ["sim", "scale", "--sync-interval", "5", "--emb-sync",
                                                                "gradients"], ("--sync-interval",))
    A("shard plan --memory-gb negative", ["shard", "plan", "--tables", "dlrm-small", "--world-size", "4",
                                          "--memory-gb", "-1"], ("--memory-gb",))
    A("run --world-size past the world bound", ["run", "--workload", "dlrm-small", "--world-size", "2000000", *store],
      ("--world-size",))
    A("run --steps past the step bound", ["run", "--workload", "dlrm-small", "--steps", "99999999999", *store],
      ("--steps",))
    A("campaign run --repeats past the repeat bound", ["campaign", "run", "--workload", "dlrm-small", "--name", "c",
                                                       "--repeats", "5000", *store], ("--repeats",))
    A("campaign run --workers past a process's threads", ["campaign", "run", "--workload", "dlrm-small", "--name",
                                                          "c", "--workers", "100000", *store], ("--workers",))
    A("fp8 probe --warmup-steps past the step bound", ["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr",
                                                       "20", "--warmup-steps", "99999999999"], ("--warmup-steps",))
    A("fp8 probe --target unknown", ["fp8", "probe", "--workload", "dlrm-small", "--budget-sqnr", "20", "--target",
                                     "nope"], ("--target",))
    A("trials show an ID past a database key", ["trials", "show", "99999999999999999999", *store], ("ID",))
    A("trials list --campaign unknown", ["trials", "list", "--campaign", "nope", *store], ("--campaign",))
    objective = ["campaign", "run", "--space", "s.yaml", "--budget", "1", "--no-baseline", "--name", "c",
                 "--storage", "sqlite:///c.db", *store]
    A("--objective with a stray brace", [*objective, "--objective", "python job.py --lr {lr"],
      ("--objective", "unclosed"), setup=job)
    A("--nproc with no {nproc} to fill", [*objective, "--objective", "python job.py --lr {lr}", "--nproc", "3"],
      ("--nproc",), setup=job)
    A("--metric empty", [*objective, "--objective", "python job.py --lr {lr}", "--metric", ""], ("--metric",),
      setup=job)

    def campaign(d: Path) -> None:
        import optuna

        from cubic.codesign.storage import META_KEY

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna.create_study(study_name="d", storage=f"sqlite:///{d / 'c.db'}").set_user_attr(META_KEY, {"name": "d"})

    dash = ["campaign", "dashboard", "d", "--storage", "sqlite:///c.db", "--port", "0", "--host"]
    A("dashboard --host that does not resolve", [*dash, "999.1.1.1"], ("--host",), setup=campaign)
    A("dashboard --host empty (every interface, a URL without a host)", [*dash, ""], ("--host",), setup=campaign)
    worker = ["run", "--storage", "sqlite:///w.db", "--name", "w", "--space",
              str(REPO / "cubic/data/space-default.yaml"), "--budget", "2"]
    for variant, extra, say in (
            ("worker --evaluate factory of the wrong signature", ["--evaluate", "json:loads"],
             ("--evaluate", "TypeError")),
            ("worker --evaluate factory returning no callable", ["--evaluate", "cubic.testing:stand_in_runner"],
             ("--evaluate", "not evaluate(point)")),
            ("worker --lease negative", ["--evaluate", "cubic.testing:make_evaluate", "--lease", "-5"], ("--lease",))):
        out.append(Attack("flags", variant, [*worker, *extra], program=WORKER, must_say=say, absent=("w.db",),
                          timeout_s=60))
    return out


def _environment_attacks() -> list[Attack]:
    """Environment: a bad value in a variable cubic reads is named as the variable, before any work
    (stop 59's probe: a traceback at import; a variable named as the flag it stands in for; a
    default output folder found unusable after the measurement; an empty trial store left behind)."""
    out: list[Attack] = []
    store = ["--store", "sqlite:///store.db"]

    def A(variant, argv, env, must_say, absent=(), quick=False):
        out.append(Attack("environment", variant, argv, setup=lambda d: (_seed_store(d, 1), (d / "f").write_text("x")),
                          env=env, must_say=must_say, rows=_trial_rows("store.db"), absent=absent, quick=quick,
                          timeout_s=60))

    A("CUBIC_DB_CONNECT_TIMEOUT_S not a number", ["trials", "list", *store], {"CUBIC_DB_CONNECT_TIMEOUT_S": "abc"},
      ("CUBIC_DB_CONNECT_TIMEOUT_S",), quick=True)
    A("CUBIC_DB_STATEMENT_TIMEOUT_S NaN", ["trials", "list", *store], {"CUBIC_DB_STATEMENT_TIMEOUT_S": "nan"},
      ("CUBIC_DB_STATEMENT_TIMEOUT_S",))
    A("CUBIC_CAMPAIGNS not a URL", ["campaign", "run", "--workload", "dlrm-small", "--simulate", "h100x8", "--name",
                                    "c", "--budget", "1"], {"CUBIC_CAMPAIGNS": "nonsense"}, ("CUBIC_CAMPAIGNS",),
      absent=(".cubic",))
    A("CUBIC_HOME a file", ["shard", "calibrate-comm", "--repeats", "1"], {"CUBIC_HOME": "f"}, ("CUBIC_HOME",))
    return out


def attacks(wd: Path, port: int) -> list[Attack]:
    """Every attack, class by class in the order of CLASSES."""
    return [*_hang_attacks(port), *_secret_attacks(), *_stray_code_attacks(), *_unbounded_file_attacks(),
            *_unbounded_size_attacks(), *_traceback_attacks(), *_message_attacks(), *_escape_attacks(),
            *_file_value_attacks(), *_trace_attacks(), *_flag_attacks(), *_environment_attacks(),
            *job_loader_attacks()]


CLASSES = ("hangs", "secrets", "stray code", "unbounded", "tracebacks", "messages", "escapes", "file values", "traces",
           "flags", "environment", "job loaders")


def run(quick: bool) -> dict[str, Any]:
    """Run every attack (``quick``: the reduced form, one or two per class); per-class results."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="cubic-inputs-") as tmp, silent_server() as port:
        for i, attack in enumerate(a for a in attacks(Path(tmp), port) if a.quick or not quick):
            wd = Path(tmp) / f"a{i:03d}"
            wd.mkdir()
            if attack.setup:
                attack.setup(wd)
            o = run_attack(attack, wd)
            if (wd / "STRAY_RAN").exists():
                o.ok, o.why = False, (o.why + "; " if o.why else "") + "a module from the cwd was imported"
            outcomes.append(o)
    classes: dict[str, Any] = {}
    for c in CLASSES:
        mine = [o for o in outcomes if o.cls == c]
        classes[c] = {"variants": len(mine), "defects": sum(not o.ok for o in mine),
                      "uncaught_exceptions": sum(o.traceback for o in mine), "hangs": sum(o.hung for o in mine),
                      "data_lost": sum(o.data_lost for o in mine),
                      "max_elapsed_s": max((o.elapsed_s for o in mine), default=0.0)}
    total = {k: sum(v[k] for v in classes.values()) for k in ("variants", "defects", "uncaught_exceptions",
                                                                "hangs", "data_lost")}
    return {"quick": quick, "classes": classes, "total": total, "outcomes": [asdict(o) for o in outcomes]}


def targets(res: dict[str, Any]) -> dict[str, Any]:
    t = res["total"]
    tried = sum(1 for c in res["classes"].values() if c["variants"])
    rows = {"attack classes tried": (tried, f">= {len(CLASSES)}", tried >= len(CLASSES)),
            "defects": (t["defects"], "0", t["defects"] == 0),
            "data lost": (t["data_lost"], "0", t["data_lost"] == 0),
            "uncaught exceptions": (t["uncaught_exceptions"], "0", t["uncaught_exceptions"] == 0),
            "hangs": (t["hangs"], "0", t["hangs"] == 0)}
    bad = [f"{o['cls']}/{o['variant']}: {o['why']}" for o in res["outcomes"] if not o["ok"]][:10]
    thin = sorted(n for n, c in res["classes"].items() if not c["variants"])
    why = {"attack classes tried": f"classes with no variant run: {thin}"}
    return {k: {"measured": v, "target": target, "met": bool(met),
                **({} if met else {"reason": why.get(k, f"{v} found; first outcomes: {bad}")})}
            for k, (v, target, met) in rows.items()}


def write(res: dict[str, Any], quick: bool, elapsed_s: float, context: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """results/reliability_inputs[_quick].json from :func:`run`'s result and the run context taken
    when it started (also called by ``python -m experiments.reliability``, which runs these attacks
    with the others)."""
    from experiments.common import png_path, write_result

    name = "reliability_inputs" + ("_quick" if quick else "")
    payload = {"context": context, **res, "targets": targets(res), "elapsed_s": round(elapsed_s, 1)}
    path = write_result(name, payload)
    plot(res, png_path(name))
    return payload, path


def plot(res: dict[str, Any], path: Path) -> None:
    """Per attack class: the variants tried, and of them the defects (tracebacks, hangs and lost data
    among them), with the slowest variant's time: the figure beside the JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["classes"])
    c = [res["classes"][n] for n in names]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    xs = range(len(names))
    ax.bar(xs, [v["variants"] for v in c], color="tab:green", label="variants tried (MEASURED)")
    ax.bar(xs, [v["defects"] for v in c], color="tab:red", label="defects (tracebacks, hangs, data lost, unclear errors)")
    for x, v in zip(xs, c):
        ax.text(x, v["variants"], f"{v['defects']} / {v['variants']}\nslowest {v['max_elapsed_s']:.1f} s",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("variants")
    ax.set_ylim(0, max(v["variants"] for v in c) * 1.3 + 1)
    t = res["total"]
    ax.set_title(f"hostile inputs through the real CLI and a user's job{' (reduced form)' if res['quick'] else ''}: "
                 f"{t['defects']} defects in {t['variants']} variants", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the reduced form (one or two variants per class)")
    args = ap.parse_args(argv)
    from experiments.common import run_context

    t0, ctx = time.monotonic(), run_context("measured")  # (its start time and load: taken before the attacks)
    res = run(args.quick)
    payload, path = write(res, args.quick, time.monotonic() - t0, ctx)
    for name, c in res["classes"].items():
        print(f"{name:11s} variants {c['variants']:2d}  defects {c['defects']}  tracebacks {c['uncaught_exceptions']}"
              f"  hangs {c['hangs']}  data lost {c['data_lost']}  (slowest {c['max_elapsed_s']} s)")
    for o in res["outcomes"]:
        if not o["ok"]:
            print(f"  DEFECT {o['cls']}: {o['variant']}: {o['why']} | {o['stderr_tail'][-200:]!r}")
    print(f"wrote {path} in {payload['elapsed_s']} s")
    return 0 if all(v["met"] for v in payload["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
