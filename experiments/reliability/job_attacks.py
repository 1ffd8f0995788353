"""The ``job loaders`` attack class: cubic's output loaded by a user's own job, not the CLI.

Three job programs, each a user's code: a TorchRec job loading a plan (:mod:`._plan_job`), a torchao
job applying a placement with its own calls (:mod:`._fp8_job`), an Optuna study with cubic's
sampler (:mod:`._optuna_job`). A plan or placement that does not fit the job's model is refused in
one line before the job's library runs; a study on parameters Optuna takes completes.
"""

from __future__ import annotations

import json

from experiments.reliability.attack import Attack, write_file

JOB = "import sys; from experiments.reliability._plan_job import main; sys.exit(main(sys.argv[1:]))"
FP8_JOB = "import sys; from experiments.reliability._fp8_job import main; sys.exit(main(sys.argv[1:]))"
OPTUNA_JOB = "import sys; from experiments.reliability._optuna_job import main; sys.exit(main(sys.argv[1:]))"


def job_loader_attacks() -> list[Attack]:
    """A plan loaded by the job it is for, against the job's model (stop 60: DMP ran a plan under a
    path with no collection, tables unsharded, without a word; a missing table was TorchRec's KeyError,
    another shape a shard-size ValueError naming no table; a table the model lacks passed)."""
    from cubic.core.spec import Table, Topology
    from sharding.torchrec_adapter import to_torchrec_json
    from sharding.types import Plan, Shard

    mine = [["t0", 100, 8], ["t1", 50, 16]]
    plan = Plan(planner="hand", world_size=1, group_size=1, batch_size=8, topology=Topology(world_size=1),
                tables=[Table(name=n, rows=r, dim=d) for n, r, d in mine],
                shards=[Shard(table=n, sharding_type="table_wise", rank=0, rows=r, cols=d) for n, r, d in mine])
    docs = {"plan.json": json.loads(plan.model_dump_json()), "tr.json": to_torchrec_json(plan)}
    out: list[Attack] = []

    def A(variant, tables, must_say, module_path="sparse.ebc", doc="plan.json", rc=(2,)):
        model = json.dumps({"at": "sparse.ebc", "tables": tables, "module_path": module_path})
        out.append(Attack("job loaders", variant, [doc, model], program=JOB, expect_rc=rc, one_line=rc == (2,),
                          setup=lambda d: write_file(d / doc, json.dumps(docs[doc])), must_say=must_say, timeout_s=120,
                          quick=variant.startswith("a path")))

    A("the model it was planned for runs sharded", mine, ("ShardedEmbeddingBagCollection",), rc=(0,))
    A("a path where the model has no collection", mine, ("module_path",), module_path="sparse_arch.ebc")
    A("a model table the plan lacks", [*mine, ["t2", 10, 4]], ("tables", "'t2'"))
    A("a plan table the model lacks", mine[:1], ("tables", "'t1'"))
    A("a table of other rows", [["t0", 200, 8], mine[1]], ("tables.t0", "200"))
    A("an export, a table of other dim", [mine[0], ["t1", 50, 32]], ("parameters.t1", "32"), doc="tr.json")
    return out + _fp8_job_attacks() + _optuna_job_attacks()


def _fp8_job_attacks() -> list[Attack]:
    """A placement applied by a torchao job's own calls (stop 61: a bare name filter converted nothing
    for a wrapped model, every site in the one config given, a site without its Mods, and block128
    was a traceback deep in torchao)."""

    def site(k, n, recipe=None, kernel=None, mods=()):
        return {"m": 128, "k": k, "n": n, "recipe": recipe, "kernel": kernel, "safe": recipe is not None,
                "applied_mods": list(mods), "reason": None if recipe else "kept in high precision"}

    def doc(**over):
        sites = {"0": site(32, 64), "2": site(64, 64, "rowwise", "scaled_mm_rowwise"),
                 "4": site(64, 48, "rowwise_with_gw_hp", "scaled_mm_rowwise_with_gw_hp"),
                 "6": site(48, 1, "tensorwise", "scaled_mm_tensorwise"), **over}
        return {"workload": "toy", "sites": sites, "module_filter": sorted(n for n, v in sites.items() if v["recipe"])}

    out: list[Attack] = []

    def A(variant, must_say, placement=None, wrap=False, last_out=1, one_call=None, rc=(2,), quick=False):
        text = json.dumps(placement or doc())
        out.append(Attack("job loaders", variant, ["fp8.json", json.dumps(
            {"wrap": wrap, "last_out": last_out, "one_call": one_call})], program=FP8_JOB, expect_rc=rc,
            one_line=rc == (2,), setup=lambda d: write_file(d / "fp8.json", text), must_say=must_say, timeout_s=120,
            quick=quick))

    A("torchao: the model it was probed on, one call per recipe", ("exactly the placement's sites",), rc=(0,))
    A("torchao: the model wrapped in the job's module", ("sites.", "'net."), wrap=True, quick=True)
    A("torchao: a site of another shape", ("sites.6", "shape"), last_out=2)
    A("torchao: one call for three recipes", ("sites", "3 recipes"), one_call="rowwise")
    A("torchao: a site with Mods", ("sites.2.applied_mods",), placement=doc(**{"2": site(
        64, 64, "rowwise", "scaled_mm_rowwise", mods=[{"name": "clamp_outliers", "params": {"alpha": 8.0}}])}))
    A("torchao: a site in block128", ("sites.4.recipe", "block128"),
      placement=doc(**{"4": site(64, 48, "block128", "emulated_block128")}))
    return out


def _optuna_job_attacks() -> list[Attack]:
    """A user's Optuna study with CubicSampler, on parameters Optuna takes (stop 61: each but the
    control stopped the study at its second trial with pydantic's dump)."""
    from experiments.reliability._optuna_job import TRIALS

    return [Attack("job loaders", f"optuna: {variant}", [kind], program=OPTUNA_JOB, expect_rc=(0,), one_line=False,
                   must_say=(f"{TRIALS} of {TRIALS} trials COMPLETE",), timeout_s=120, quick=kind == "none")
            for kind, variant in (("control", "a plain study"), ("none", "a categorical with a None choice"),
                                  ("seed", "an int range past 2**53"), ("step", "a float step of 1e-16"),
                                  ("name", "a 201-character parameter name"))]
