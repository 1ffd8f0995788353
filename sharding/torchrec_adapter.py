"""TorchRec bridge (optional extra: torchrec 1.9.2 + fbgemm-gpu-cpu 1.8.0, installed with --no-deps).

- :class:`TorchRecPlanner` runs TorchRec's own ``EmbeddingShardingPlanner`` (its enumerator,
  analytical estimators, proposers and greedy partitioner) on the tables and converts its
  ``ShardingPlan`` into a cubic :class:`Plan`, so it is scored by the same measured cost.
- :func:`torchrec_layout` maps each table onto what TorchRec executes (or raises SpecError naming it);
  :func:`load_plan` gives the ``ShardingPlan`` a training job passes to DMP;
- :func:`to_torchrec` turns a cubic plan into TorchRec's ``ParameterConstraints`` per table and an
  ``EmbeddingModuleShardingPlan`` (``ParameterSharding`` with an ``EnumerableShardingSpec`` of
  ``ShardMetadata``), i.e. what ``DistributedModelParallel(plan=...)`` consumes;
  :func:`to_torchrec_json` is its plain JSON form for ``cubic shard export``.

Importing this module never imports torchrec; :func:`torchrec_available` says whether it works.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import NamedTuple

from cubic.core.spec import SpecError
from sharding.estimate import Estimator
from sharding.planners import Context, Planner, planner_context, with_prediction
from sharding.types import Plan, Shard, Storage

_TYPE_TO_CUBIC = {"table_wise": "table_wise", "column_wise": "column_wise", "table_column_wise": "column_wise",
                  "row_wise": "row_wise", "table_row_wise": "table_row_wise", "data_parallel": "data_parallel",
                  "grid_shard": "column_wise"}


@lru_cache(maxsize=1)
def torchrec_available() -> bool:
    try:
        import torchrec  # noqa: F401
        from torchrec.distributed.planner import EmbeddingShardingPlanner  # noqa: F401
        return True
    except Exception:  # optional extra absent or incompatible with this torch
        return False


def _require() -> None:
    if not torchrec_available():
        raise SpecError("torchrec is not installed (optional extra: make installs torchrec==1.9.2 "
                        "fbgemm-gpu-cpu==1.8.0 with --no-deps)", field="torchrec")


def _device(topology) -> str:
    return "cuda" if topology.device in ("cuda", "h100", "h200") else "cpu"


class TorchRecPlanner(Planner):
    name = "torchrec"

    def __init__(self, estimator: Estimator | None = None, hbm_bytes: float | None = None):
        """``hbm_bytes``: HBM per rank on a GPU topology (the topology's memory per rank is then HBM +
        host), so TorchRec chooses its own kernels (fused, fused_uvm_caching, fused_uvm); the plan
        keeps them in ``Plan.kernels``."""
        self.estimator, self.hbm_bytes = estimator, hbm_bytes

    def plan(self, tables, topology, batch_size, group_size=None, sync=None) -> Plan:
        _require()
        import torch
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
        from torchrec.distributed.planner import Topology as TRTopology
        from torchrec.distributed.planner.types import PlannerError
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.embedding_modules import EmbeddingBagCollection

        t0 = time.perf_counter()
        # TorchRec's planner does not price a replica sync; the plan's prediction does, with ``sync``
        ctx: Context = planner_context(tables, topology, batch_size, group_size, self.estimator, sync=sync)
        ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                       feature_names=[f"f_{t.name}"]) for t in ctx.tables],
            device=torch.device("meta"),
        )
        constraints = {t.name: ParameterConstraints(pooling_factors=[float(t.pooling_factor)]) for t in ctx.tables}
        dev = _device(topology)
        cap = int(ctx.memory_bytes)
        # TorchRec is told the same network as cubic's planners (its bandwidths are bytes per ms)
        topo = TRTopology(world_size=ctx.group, compute_device=dev, local_world_size=min(ctx.group, topology.ranks_per_node),
                          hbm_cap=(int(self.hbm_bytes) if self.hbm_bytes else cap) if dev == "cuda" else None,
                          ddr_cap=cap,
                          intra_host_bw=1e-3 / ctx.comm.beta_intra_s_per_byte,
                          inter_host_bw=1e-3 / ctx.comm.beta_inter_s_per_byte)
        planner = EmbeddingShardingPlanner(topology=topo, batch_size=batch_size, constraints=constraints)
        try:
            sp = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
        except PlannerError as e:
            raise SpecError(f"TorchRec's planner found no plan: {str(e).splitlines()[0]}", field="torchrec") from None
        shards = []
        kernels = {}
        for _, module_plan in sp.plan.items():
            for name, ps in module_plan.items():
                if ps.compute_kernel in ("fused_uvm_caching", "fused_uvm"):
                    from sharding.kernels import KernelChoice, zipf_hit_rate

                    t = next(t for t in ctx.tables if t.name == name)
                    lf = (ps.cache_params.load_factor if ps.cache_params and ps.cache_params.load_factor else 0.2
                          ) if ps.compute_kernel == "fused_uvm_caching" else None
                    kernels[name] = KernelChoice(compute_kernel=ps.compute_kernel, cache_load_factor=lf,
                                                 hit_rate=zipf_hit_rate(t, lf) if lf else None)
                kind = _TYPE_TO_CUBIC.get(ps.sharding_type)
                if kind is None:
                    raise SpecError(f"unsupported TorchRec sharding type {ps.sharding_type}", field=name)
                t = next(t for t in ctx.tables if t.name == name)
                if kind == "data_parallel" or ps.sharding_spec is None:
                    shards += [Shard(table=name, sharding_type="data_parallel", rank=r, rows=t.rows, cols=t.dim)
                               for r in range(ctx.group)]
                    continue
                for md in ps.sharding_spec.shards:
                    rows, cols = md.shard_sizes
                    if rows == 0 or cols == 0:
                        continue
                    shards.append(Shard(table=name, sharding_type=kind, rank=md.placement.rank(),
                                        row_offset=md.shard_offsets[0], rows=rows,
                                        col_offset=md.shard_offsets[1], cols=cols))
        plan = Plan(planner="torchrec", target="torchrec", world_size=ctx.world, group_size=ctx.group, batch_size=batch_size,
                    topology=topology, tables=ctx.tables, shards=shards, planning_time_s=time.perf_counter() - t0,
                    notes="TorchRec EmbeddingShardingPlanner (its own analytical cost model)", comm=ctx.comm.describe(),
                    kernels=kernels, sync=ctx.sync if ctx.group < ctx.world else None)
        return with_prediction(plan, self.estimator, ctx.comm)


class Layout(NamedTuple):
    """One table as TorchRec lays it out: type, kernel, ranks, and (row_off, rows, col_off, cols, rank) shards
    in TorchRec's order (empty row blocks included, as TorchRec's row-wise keeps one block per rank)."""

    sharding_type: str
    compute_kernel: str
    ranks: list[int]
    shards: list[tuple[int, int, int, int, int]] | None
    cache_load_factor: float | None = None  # fused_uvm_caching: TorchRec's CacheParams.load_factor


REPLAN = "re-plan with --target torchrec"


def local_size_of(plan: Plan, local_size: int | None = None) -> int:
    """Ranks per node as TorchRec sees them (LOCAL_WORLD_SIZE): the topology's, capped at the group;
    one given must divide the plan's ranks (a job's nodes hold equal numbers of them)."""
    if local_size is not None and (local_size > plan.world_size or plan.world_size % local_size):
        raise SpecError(f"must divide the plan's {plan.world_size} ranks, got {local_size}", field="--local-size")
    return local_size or min(plan.topology.ranks_per_node, plan.group_size)


def torchrec_layout(plan: Plan, local_size: int | None = None) -> dict[str, Layout]:
    """Each table's TorchRec layout, or SpecError naming the first table TorchRec cannot run as planned.

    What TorchRec 1.9 executes (read off torchrec/distributed/sharding/*_sharding.py):
    table-wise = one whole shard on one rank; column-wise = full-height column blocks on any ranks;
    data-parallel = a replica on every rank; row-wise = block i of its even split
    (:func:`sharding.enumerate.torchrec_row_blocks`) on rank i, over ALL ranks of the group (its input
    dist buckets ids by that block size); table-row-wise = the same split over the ranks of one node.
    A cubic row split of another shape maps to neither, and is refused rather than exported wrong.
    """
    from sharding.enumerate import torchrec_row_blocks

    G = plan.group_size
    L = local_size_of(plan, local_size)
    by_table: dict[str, list[Shard]] = {}
    for s in plan.shards:
        by_table.setdefault(s.table, []).append(s)
    out: dict[str, Layout] = {}
    for t in plan.tables:
        ss = sorted(by_table[t.name], key=lambda s: (s.row_offset, s.col_offset, s.rank))
        kind = ss[0].sharding_type
        where = f"table {t.name}"
        if kind == "data_parallel":
            out[t.name] = Layout("data_parallel", "dense", sorted(s.rank for s in ss), None)
        elif kind == "table_wise":
            s = ss[0]
            out[t.name] = Layout("table_wise", "fused", [s.rank], [(0, t.rows, 0, t.dim, s.rank)])
        elif kind == "column_wise":
            if any(s.row_offset or s.rows != t.rows for s in ss):
                raise SpecError(f"{where}: column-wise shards must span all {t.rows} rows; {REPLAN}", field=t.name)
            bad = [s.cols for s in ss if s.cols % 4]
            if len(ss) > 1 and bad:
                raise SpecError(f"{where}: column shard widths {bad} are not multiples of 4 (FBGEMM's vector "
                                f"width); {REPLAN}", field=t.name)
            out[t.name] = Layout("column_wise", "fused", [s.rank for s in ss],
                                 [(0, t.rows, s.col_offset, s.cols, s.rank) for s in ss])
        elif kind in ("row_wise", "table_row_wise"):
            if any(s.col_offset or s.cols != t.dim for s in ss):
                raise SpecError(f"{where}: {kind} shards must span all {t.dim} columns; {REPLAN}", field=t.name)
            got = [(s.row_offset, s.rows, s.rank) for s in ss]
            ranks = [s.rank for s in ss]
            rw = torchrec_row_blocks(t.rows, G)
            if kind == "row_wise" and got == [(o, n, i) for i, (o, n) in enumerate(rw) if n]:
                out[t.name] = Layout("row_wise", "fused", list(range(G)),
                                     [(o, n, 0, t.dim, i) for i, (o, n) in enumerate(rw)])
                continue
            node = ranks[0] // L
            tw = [(o, n, node * L + i) for i, (o, n) in enumerate(torchrec_row_blocks(t.rows, L))]
            if G % L == 0 and got == [x for x in tw if x[1]]:
                out[t.name] = Layout("table_row_wise", "fused", [r for _, _, r in tw],
                                     [(o, n, 0, t.dim, r) for o, n, r in tw])
                continue
            label = kind.replace("_", "-")
            if kind == "row_wise" and sorted(ranks) != list(range(G)):
                why = (f"TorchRec row-wise spans all {G} ranks"
                       + (f" (table-row-wise: the {L} ranks of one node)" if L < G else ""))
            elif kind == "row_wise":
                why = f"TorchRec cuts {t.rows} rows over {G} ranks as {[n for _, n in rw]} (block i on rank i)"
            else:
                why = (f"TorchRec table-row-wise cuts {t.rows} rows as {[n for _, n, _ in tw]} over ranks "
                       f"{[r for _, _, r in tw]} (one node of {L})")
            raise SpecError(f"{where}: {label} rows {[s.rows for s in ss]} over ranks {ranks} of {G}: {why}; {REPLAN}",
                            field=t.name)
        else:
            raise SpecError(f"{where}: sharding type {kind} has no TorchRec equivalent", field=t.name)
    for name, k in (plan.kernels or {}).items():  # the plan's kernel and memory tier per table
        out[name] = out[name]._replace(compute_kernel=k.compute_kernel, cache_load_factor=k.cache_load_factor)
    return out


def _device_name(device: str) -> str:
    return "cuda" if device in ("cuda", "gpu", "h100", "h200") else "cpu"


def _parameter_shardings(layouts: dict[str, Layout], device: str, local_size: int) -> dict:
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import CacheParams, ParameterSharding

    out = {}
    for name, lay in layouts.items():
        spec = None if lay.shards is None else EnumerableShardingSpec([
            ShardMetadata(shard_offsets=[ro, co], shard_sizes=[rows, cols], placement=placement(device, r, local_size))
            for ro, rows, co, cols, r in lay.shards])
        cache = CacheParams(load_factor=lay.cache_load_factor) if lay.cache_load_factor is not None else None
        out[name] = ParameterSharding(sharding_type=lay.sharding_type, compute_kernel=lay.compute_kernel,
                                      ranks=list(lay.ranks), sharding_spec=spec, cache_params=cache)
    return out


def to_torchrec(plan: Plan, local_size: int | None = None, device: str | None = None):
    """(ParameterConstraints per table, EmbeddingModuleShardingPlan) of a cubic plan; SpecError if TorchRec
    cannot execute it as planned (see :func:`torchrec_layout`)."""
    _require()
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    layouts = torchrec_layout(plan, local_size)
    dev = _device_name(device or plan.topology.device)
    constraints = {t.name: ParameterConstraints(sharding_types=[layouts[t.name].sharding_type],
                                                compute_kernels=[layouts[t.name].compute_kernel],
                                                pooling_factors=[float(t.pooling_factor)]) for t in plan.tables}
    return constraints, EmbeddingModuleShardingPlan(_parameter_shardings(layouts, dev, local_size_of(plan, local_size)))


EXPORT_FORMAT = "torchrec-1.9-module-sharding-plan"


def to_torchrec_json(plan: Plan, local_size: int | None = None) -> dict:
    """The TorchRec plan as plain JSON (field names as in torchrec's ParameterSharding/ShardMetadata).

    ``world_size`` is the model-parallel group (DMP's world; DMPCollection's sharding group under 2D),
    ``local_world_size`` the ranks per node TorchRec must see (its LOCAL_WORLD_SIZE) for table-row-wise.
    """
    layouts = torchrec_layout(plan, local_size)
    L = local_size_of(plan, local_size)
    dev = _device_name(plan.topology.device)
    out: dict = {"format": EXPORT_FORMAT, "world_size": plan.group_size, "local_world_size": L,
                 "replicas": plan.world_size // plan.group_size, "device": dev, "parameters": {}}
    for t in plan.tables:
        lay = layouts[t.name]
        out["parameters"][t.name] = {
            "sharding_type": lay.sharding_type, "compute_kernel": lay.compute_kernel, "shape": [t.rows, t.dim],
            "cache_load_factor": lay.cache_load_factor, "ranks": lay.ranks,
            "constraints": {"sharding_types": [lay.sharding_type], "pooling_factors": [t.pooling_factor]},
            "shards": None if lay.shards is None else [
                {"shard_offsets": [ro, co], "shard_sizes": [rows, cols], "rank": r} for ro, rows, co, cols, r in lay.shards],
        }
    return out


def _layouts_from_json(doc: dict, source: str) -> dict[str, Layout]:
    try:
        return {name: Layout(p["sharding_type"], p["compute_kernel"], [int(r) for r in p["ranks"]],
                             None if p["shards"] is None else [
                                 (int(s["shard_offsets"][0]), int(s["shard_sizes"][0]), int(s["shard_offsets"][1]),
                                  int(s["shard_sizes"][1]), int(s["rank"])) for s in p["shards"]],
                             None if p.get("cache_load_factor") is None else float(p["cache_load_factor"]))
                for name, p in doc["parameters"].items()}
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise SpecError(f"not an exported TorchRec plan ({type(e).__name__}: {e})", source=source,
                        field="parameters") from None


def validate_in_torchrec(plan: Plan, local_size: int | None = None) -> None:
    """TorchRec's own checks of the plan's ParameterShardings: ``validate_compute_kernels`` (known
    kernel, dense only for data-parallel, a cache load factor in (0, 1) for caching kernels,
    non-negative storage) on the ShardingOptions they describe, and ``validate_rank_assignment`` on
    the ShardingPlan; a violation is a SpecError carrying TorchRec's message. What cannot run on
    this CPU (UVM caching) is checked this way here, and on a GPU by experiments/gpu_checks.py."""
    _require()
    import torch
    from torchrec.distributed.planner import Topology as TRTopology
    from torchrec.distributed.planner.planners import validate_compute_kernels, validate_rank_assignment
    from torchrec.distributed.planner.types import PlannerError, ShardingOption
    from torchrec.distributed.planner.types import Shard as TRShard
    from torchrec.distributed.planner.types import Storage as TRStorage
    from torchrec.distributed.types import ShardingPlan

    from sharding.kernels import KernelChoice, hbm_bytes

    layouts = torchrec_layout(plan, local_size)
    L = local_size_of(plan, local_size)
    dev = _device_name(plan.topology.device)
    pss = _parameter_shardings(layouts, dev, L)
    options = []
    for t in plan.tables:
        ps, lay = pss[t.name], layouts[t.name]
        k = (plan.kernels or {}).get(t.name) or KernelChoice(compute_kernel="dense" if lay.compute_kernel == "dense"
                                                            else "fused")
        pieces = lay.shards or [(0, t.rows, 0, t.dim, r) for r in lay.ranks]
        shards = []
        for ro, rows, co, cols, r in pieces:
            w, o = Storage.parts(rows, cols)  # the plan's own storage rule
            hbm = hbm_bytes(w, o, k) if k.compute_kernel in ("fused", "fused_uvm", "fused_uvm_caching") else w + o
            shards.append(TRShard(size=[rows, cols], offset=[ro, co], rank=r,
                                  storage=TRStorage(hbm=int(hbm), ddr=int(w + o - hbm))))
        options.append(ShardingOption(name=t.name, tensor=torch.empty((t.rows, t.dim), device="meta"),
                                      module=("", torch.nn.Module()), input_lengths=[float(t.pooling_factor)],
                                      batch_size=plan.batch_size, sharding_type=ps.sharding_type,
                                      partition_by="uniform", compute_kernel=ps.compute_kernel, shards=shards,
                                      cache_params=ps.cache_params))
    try:
        validate_compute_kernels(options)
        validate_rank_assignment(ShardingPlan({"": EmbeddingModuleShardingPlan_of(pss)}),
                                 TRTopology(world_size=plan.group_size, compute_device=dev, local_world_size=L))
    except PlannerError as e:
        lines = [x.strip(" -") for x in str(e).splitlines() if x.strip()]
        raise SpecError("TorchRec's validation: " + "; ".join(lines[1:] or lines), field="kernels") from None


def EmbeddingModuleShardingPlan_of(pss: dict):
    from torchrec.distributed.types import EmbeddingModuleShardingPlan

    return EmbeddingModuleShardingPlan(pss)


def load_plan(path, module_path: str | None = None, device: str | None = None, local_size: int | None = None,
              world_size: int | None = None, local_world_size: int | None = None, model=None):
    """A ``torchrec.distributed.types.ShardingPlan`` for ``DistributedModelParallel(plan=...)``.

    ``path``: a cubic plan (``cubic shard plan --out``) or its export (``cubic shard export``).
    ``model``: the module DMP will wrap; the plan is checked against it (:func:`check_model`): its
    embedding collection at ``module_path`` (found when there is one and no path is given), every
    table by name, rows and dim. Without it nothing is checked: DMP leaves a collection the plan does
    not name unsharded, without a word (a ``UserWarning`` says so).
    ``module_path``: where the EmbeddingBagCollection sits in the model DMP wraps ("" when DMP wraps
    the collection itself, e.g. "sparse_arch.embedding_bag_collection" in TorchRec's DLRM).
    ``device``: "cuda" or "cpu" (default: the plan's). ``local_size``: ranks per node (default: the
    plan's); it must equal the job's LOCAL_WORLD_SIZE when a table is table-row-wise.
    ``world_size``/``local_world_size``: the job's (default: torch.distributed's when initialised,
    else $WORLD_SIZE/$LOCAL_WORLD_SIZE): checked against the plan before TorchRec sees it.
    Raises SpecError (one line) when the plan cannot run under TorchRec as planned.
    """
    from cubic.core.spec import read_structured

    return load_plan_dict(read_structured(path), module_path, device, local_size, source=str(path),
                          world_size=world_size, local_world_size=local_world_size, model=model)


def job_sizes(world_size: int | None = None, local_world_size: int | None = None) -> tuple[int | None, int | None]:
    """The running job's (world size, local world size): the arguments, else torch.distributed's
    world when initialised and $WORLD_SIZE / $LOCAL_WORLD_SIZE (None where nothing says)."""
    import os

    if world_size is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                world_size = dist.get_world_size()
        except Exception:  # torch without distributed: fall back to the launcher's variables
            pass
    env = {k: os.environ.get(k, "") for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    if world_size is None and env["WORLD_SIZE"].isdigit():
        world_size = int(env["WORLD_SIZE"])
    if local_world_size is None and env["LOCAL_WORLD_SIZE"].isdigit():
        local_world_size = int(env["LOCAL_WORLD_SIZE"])
    return world_size, local_world_size


def check_job(plan_world: int, plan_local: int, layouts: dict[str, Layout], source: str,
              world_size: int | None = None, local_world_size: int | None = None) -> None:
    """One line (SpecError) when the job cannot run the plan: another world size, or another local
    world size while a table is table-row-wise (its rows are split over one node's ranks)."""
    world, local = job_sizes(world_size, local_world_size)
    if world is not None and world != plan_world:
        raise SpecError(f"the plan is for {plan_world} ranks but this job has {world} (WORLD_SIZE); re-plan with "
                        f"--world-size {world}", source=source, field="world_size")
    twrw = sorted(n for n, lay in layouts.items() if lay.sharding_type == "table_row_wise")
    if local is not None and twrw and local != plan_local:
        raise SpecError(f"table {twrw[0]!r} is table-row-wise over {plan_local} ranks per node but this job has "
                        f"{local} (LOCAL_WORLD_SIZE); re-plan with --ranks-per-node {local}", source=source,
                        field="local_world_size")


def embedding_collections(model) -> dict:
    """``{path: module}`` of the model's EmbeddingBagCollections and EmbeddingCollections (what DMP's
    default sharders shard)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    return {n: m for n, m in model.named_modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))}


def check_model(model, module_path: str | None, shapes: dict[str, tuple[int, int] | None], source: str,
                field: str = "tables") -> str:
    """The path of the collection DMP shards with the plan, checked against ``model``; SpecError (one
    line) otherwise. Unchecked, a path naming no collection left every table unsharded without a word
    (DMP shards only what the plan names), a model table the plan lacks was TorchRec's ``KeyError``, a
    table of another shape its shard-size ``ValueError``, and a plan table the model lacks passed."""
    found = embedding_collections(model)
    names = ", ".join(repr(n) for n in found) or "none"
    if module_path is None:
        if len(found) != 1:
            raise SpecError(f"the model has {len(found)} embedding collections ({names}); name the one to shard "
                            "with module_path", source=source, field="module_path")
        module_path = next(iter(found))
    elif module_path not in found:
        raise SpecError(f"the model has no EmbeddingBagCollection or EmbeddingCollection at {module_path!r} (its "
                        f"collections: {names}); DMP would leave its tables unsharded", source=source,
                        field="module_path")
    coll = found[module_path]
    cfgs = coll.embedding_bag_configs() if hasattr(coll, "embedding_bag_configs") else coll.embedding_configs()
    have = {c.name: (int(c.num_embeddings), int(c.embedding_dim)) for c in cfgs}
    where = f"the model's {module_path!r}" if module_path else "the model"
    extra, missing = sorted(set(shapes) - set(have)), sorted(set(have) - set(shapes))
    if extra:
        raise SpecError(f"table {extra[0]!r} is in the plan but not in {where} (its tables: "
                        f"{', '.join(sorted(have))}): a plan for another model; re-plan with this model's tables",
                        source=source, field=field)
    if missing:
        raise SpecError(f"{where} has table {missing[0]!r}, which the plan does not place; re-plan with this "
                        "model's tables", source=source, field=field)
    for name in sorted(shapes):
        if shapes[name] is not None and shapes[name] != have[name]:
            (r, d), (mr, md) = shapes[name], have[name]
            raise SpecError(f"table {name!r}: the plan places {r} rows x {d} dims, {where} has {mr} x {md}; re-plan "
                            "with this model's tables", source=source, field=f"{field}.{name}")
    return module_path


def _shapes(layouts: dict[str, Layout], doc: dict, source: str) -> dict[str, tuple[int, int] | None]:
    """An export's (rows, dim) per table: its ``shape`` (written since stop 60), else the extent of its
    shards; None for a data-parallel table of an older export (no shards to read it from). A ``shape``
    that is not two positive integers, or that its own shards overrun, is refused naming it: the
    check against the model must not rest on a value the rest of the export contradicts."""
    out: dict[str, tuple[int, int] | None] = {}
    for name, lay in layouts.items():
        shape = doc["parameters"][name].get("shape")
        extent = ((max(ro + n for ro, n, _, _, _ in lay.shards), max(co + c for _, _, co, c, _ in lay.shards))
                  if lay.shards else None)
        if shape is None:
            out[name] = extent
            continue
        if not (isinstance(shape, list) and len(shape) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in shape)):
            raise SpecError(f"{shape!r} is not [rows, dim], two positive integers", source=source,
                            field=f"parameters.{name}.shape")
        if extent is not None and (extent[0] > shape[0] or extent[1] > shape[1]):
            raise SpecError(f"the table is {shape[0]} x {shape[1]} but its shards cover {extent[0]} x {extent[1]}",
                            source=source, field=f"parameters.{name}.shape")
        out[name] = (shape[0], shape[1])
    return out


def load_plan_dict(doc: dict, module_path: str | None = None, device: str | None = None, local_size: int | None = None,
                   source: str = "plan", world_size: int | None = None, local_world_size: int | None = None,
                   model=None):
    """:func:`load_plan` of an already parsed document (a cubic plan or its export)."""
    _require()
    from sharding.types import plan_from_dict
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan

    if isinstance(doc, dict) and doc.get("format") == EXPORT_FORMAT:
        layouts = _layouts_from_json(doc, source)
        L = local_size or int(doc.get("local_world_size") or doc.get("world_size") or 1)
        dev = _device_name(device or doc.get("device", "cpu"))
        try:
            plan_world = int(doc["world_size"]) * int(doc.get("replicas") or 1)
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"not an exported TorchRec plan ({type(e).__name__}: {e})", source=source,
                            field="world_size") from None
        shapes, field = _shapes(layouts, doc, source), "parameters"
    else:
        plan = plan_from_dict(doc, source=source)
        layouts = torchrec_layout(plan, local_size)
        L = local_size_of(plan, local_size)
        dev = _device_name(device or plan.topology.device)
        plan_world = plan.world_size
        shapes, field = {t.name: (t.rows, t.dim) for t in plan.tables}, "tables"
    check_job(plan_world, L, layouts, source, world_size, local_world_size)
    if model is not None:
        module_path = check_model(model, module_path, shapes, source, field)
    else:  # kept for old callers, but said: DMP leaves a collection the plan does not name unsharded, silently
        import warnings

        warnings.warn(f"{source}: load_plan without model= checks the plan against nothing the job has: a wrong "
                      "module_path or another model's tables reach DMP unchecked (pass model=the module DMP wraps)",
                      UserWarning, stacklevel=3)
    return ShardingPlan({module_path or "": EmbeddingModuleShardingPlan(_parameter_shardings(layouts, dev, L))})
