"""Sanity of the simulated-cluster step model (cubic/runners/step_model.py). Everything here is SIMULATED."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cost_models.hardware import CLUSTERS
from cubic.runners.step_model import (
    StepModelParams,
    dense_sites,
    predict_step,
    zipf_stats,
)
from cubic.core.config import Config, FP8Choice, Kernels, ShardingChoice
from cubic.core.spec import SpecError, Topology, Workload, WukongArch
from cubic.core.workloads import DEFAULT_WORKLOADS, generate_tables

H100 = CLUSTERS["h100"]
BF16 = Kernels(dense_dtype="bf16")


def mid_workload(dim_scale: int = 1, batch: int = 1024) -> Workload:
    """~100 GB of tables with a Wukong dense part: fits 8 H100s, fast to simulate."""
    tables = generate_tables(120, seed=5, min_rows=10_000, max_rows=20_000_000, rows_shape=0.6,
                             dims=tuple(d * dim_scale for d in (8, 16, 32, 64)))
    return Workload(name="mid", tables=tables, batch_size=batch,
                    dense_arch=WukongArch(num_layers=3, emb_dim=64, num_emb_lcb=64, num_emb_fmb=64, rank_fmb=16,
                                          mlp_width=1024, top_mlp=[512, 1]),
                    topology=Topology(world_size=64, device="h100", memory_per_rank_gb=80))


def cfg(group_size=None, **kw) -> Config:
    return Config(kernels=BF16, sharding=ShardingChoice(planner="sim", group_size=group_size), **kw)


def test_zipf_unique_rows_and_cache_hits():
    n = np.array([1e3, 1e5, 1e7])
    rows = np.array([1e6, 1e6, 1e6])
    u_uniform, _ = zipf_stats(n, rows, np.zeros(3))
    # uniform access has a closed form: rows * (1 - exp(-n / rows))
    assert np.allclose(u_uniform, rows * -np.expm1(-n / rows), rtol=0.02)
    u_skew, hit = zipf_stats(n, rows, np.full(3, 1.2), cache_rows=np.full(3, 1e4))
    assert np.all(u_skew < u_uniform) and np.all(u_skew <= np.minimum(n, rows))
    _, hit_flat = zipf_stats(n, rows, np.full(3, 0.3), cache_rows=np.full(3, 1e4))
    assert np.all(hit > hit_flat) and np.all((0 <= hit) & (hit <= 1))
    assert hit_flat[0] == pytest.approx(hit_flat[2])  # hit share does not depend on the draws


def test_step_grows_with_batch_and_dims():
    w = mid_workload()
    small = predict_step(w, cfg(batch_size=512), H100, 16)
    big = predict_step(w, cfg(batch_size=4096), H100, 16)
    assert big.step_s > small.step_s
    assert big.phases_s["dense_fwd"] > small.phases_s["dense_fwd"]
    assert big.peak_mem_bytes > small.peak_mem_bytes
    wide = predict_step(mid_workload(dim_scale=2), cfg(), H100, 16)
    narrow = predict_step(w, cfg(), H100, 16)
    assert wide.phases_s["embedding_fwd"] > narrow.phases_s["embedding_fwd"]
    assert wide.phases_s["a2a_output_fwd"] > narrow.phases_s["a2a_output_fwd"]
    assert math.isclose(sum(narrow.phases_s.values()), narrow.step_s)


def test_full_sharding_comm_grows_with_world_size():
    w = mid_workload()
    preds = [predict_step(w, cfg(), H100, W) for W in (8, 64, 512)]
    comm = [p.phases_s["a2a_output_fwd"] for p in preds]
    assert comm[0] < comm[1] < comm[2]  # NVLink only at 8; then the network and more peers
    per_gpu = [p.examples_per_s / p.world_size for p in preds]
    assert per_gpu[0] > per_gpu[1] > per_gpu[2]


def test_2d_keeps_all_to_all_inside_the_group_and_scales_better():
    w = mid_workload()
    full = predict_step(w, cfg(), H100, 1024)
    two_d = [predict_step(w, cfg(group_size=8), H100, W) for W in (64, 1024)]
    # the group's all-to-all does not depend on the world size (the greedy planner weighs each piece's
    # replica sync, which does, so the placement may move a little); only replica sync and all-reduce do
    assert two_d[0].phases_s["a2a_output_fwd"] == pytest.approx(two_d[1].phases_s["a2a_output_fwd"], rel=0.05)
    pinned = two_d[1].sharding_plan.model_copy(update={"world_size": 64})
    again = predict_step(w, cfg(group_size=8).model_copy(update={"sharding": ShardingChoice(
        plan=pinned.model_dump(mode="json"))}), H100, 64)
    assert again.phases_s["a2a_output_fwd"] == pytest.approx(two_d[1].phases_s["a2a_output_fwd"])
    assert two_d[1].phases_s["embedding_sync"] > 0 and full.phases_s["embedding_sync"] == 0
    assert two_d[1].plan["replicas"] == 128 and full.plan["replicas"] == 1
    assert two_d[1].examples_per_s > full.examples_per_s
    # exact per-step gradient sync of touched rows costs more than periodic weight averaging here
    grads = predict_step(w, cfg(group_size=8), H100, 1024, StepModelParams(emb_sync="gradients"))
    assert grads.phases_s["embedding_sync"] != two_d[1].phases_s["embedding_sync"]


def test_group_size_must_divide_world_size():
    with pytest.raises(SpecError, match="a group of 24 ranks must divide the world size 64"):
        predict_step(mid_workload(), cfg(group_size=24), H100, 64)


def test_oom_when_tables_exceed_hbm():
    big = DEFAULT_WORKLOADS["wukong-large"]  # ~470 GB of fp32 tables
    p = predict_step(big, cfg(), H100, 4)
    assert p.oom and "exceeds" in p.oom_reason and p.peak_mem_bytes > H100.device.hbm_bytes
    # activations alone: an absurd batch on a big dense part
    p2 = predict_step(mid_workload(batch=2_000_000), cfg(), H100, 64)
    assert p2.oom and p2.peak_mem_bytes > H100.device.hbm_bytes and "exceeds" in p2.oom_reason
    ok = predict_step(mid_workload(), cfg(), H100, 64)
    assert not ok.oom and ok.peak_mem_bytes < H100.device.hbm_bytes


def test_fp8_dense_faster_than_bf16_on_big_gemms():
    dense = lambda p: p.phases_s["dense_fwd"] + p.phases_s["dense_bwd"]  # noqa: E731
    # big square-ish GEMMs: FP8 everywhere wins
    wide = Workload(name="wide", tables=generate_tables(8, seed=1, dims=(64,)), batch_size=8192,
                    dense_arch={"kind": "dlrm", "bottom_mlp": [4096, 64], "top_mlp": [8192, 8192, 1]})
    bf16 = predict_step(wide, cfg(), H100, 8)
    fp8 = predict_step(wide, cfg(fp8=FP8Choice(policy="all", recipe="tensorwise")), H100, 8)
    assert dense(fp8) < 0.8 * dense(bf16)
    assert fp8.dense["site_precisions"].get("fp8", 0) > 0
    # wukong-large: skinny [B*d, n_emb] GEMMs pay more in casts than they gain, so FP8 only on the
    # big MLP sites (an explicit placement) beats both bf16 and FP8 everywhere
    w = DEFAULT_WORKLOADS["wukong-large"]
    base = predict_step(w, cfg(), H100, 64)
    everywhere = predict_step(w, cfg(fp8=FP8Choice(policy="all")), H100, 64)
    # named as `cubic fp8 probe` names them: the real model's modules
    sites = {f"dense.{name}": {"m": w.batch_size, "k": m.in_features, "n": m.out_features, "recipe": "tensorwise",
                               "kernel": "scaled_mm_tensorwise"}
             for name, m in _real_linears(w).items() if ".fmb.mlp." in name or name == "top.fc.0"}
    doc = {"version": 1, "workload": w.name, "sites": sites, "module_filter": sorted(sites)}
    placed = predict_step(w, cfg(fp8=FP8Choice(policy="placement", placement=doc)), H100, 64)
    assert dense(placed) < dense(base) and dense(placed) < dense(everywhere)
    # the one placement parser (fp8.placement): a site list that is not the schema is named
    with pytest.raises(SpecError, match="config.fp8.placement"):
        not_the_schema = {"sites": [{"site": "top.fc.0", "recipe": "tensorwise"}]}
        predict_step(w, cfg(fp8=FP8Choice(policy="placement", placement=not_the_schema)), H100, 64)
    fp32 = predict_step(w, Config(sharding=ShardingChoice(planner="sim")), H100, 64)
    assert dense(fp32) > dense(base)


def _real_linears(w: Workload) -> dict:
    from fp8.runtime import workload_linear_sites

    # the real model's modules under its dense part, as the simulator's sites name them
    return {n.removeprefix("dense."): m for n, m in workload_linear_sites(w).items()}


def test_dense_sites_follow_the_arch():
    w = DEFAULT_WORKLOADS["wukong-large"]
    sites = dense_sites(w, 2048)
    names = {s.name for s in sites}
    assert {"layers.0.fmb.mlp.fc.0", "layers.7.lcb.proj", "top.fc.0"} <= names
    assert sum(1 for s in sites if s.name.endswith(".lcb.proj")) == w.dense_arch.num_layers
    for name in ("dlrm-small", "dmt-small"):
        assert any(s.name.startswith("top.") for s in dense_sites(DEFAULT_WORKLOADS[name], 64))


def _variant(name: str) -> Workload:
    """An embedded workload, or one with its dense features or its layers' LayerNorm removed."""
    base, _, change = name.partition("/")
    w = DEFAULT_WORKLOADS[base]
    if change == "no-dense":
        return w.model_copy(update={"data": w.data.model_copy(update={"num_dense_features": 0})})
    if change == "no-layer-norm":
        return w.model_copy(update={"dense_arch": w.dense_arch.model_copy(update={"layer_norm": False})})
    return w


VARIANTS = [*sorted(DEFAULT_WORKLOADS), "dlrm-small/no-dense", "dmt-small/no-dense", "wukong-small/no-dense",
            "wukong-small/no-layer-norm"]


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_sites_are_the_real_models_modules(name):
    """The simulator's linear sites stand for exactly the real model's nn.Linear modules (the names a
    placement from `cubic fp8 probe` carries): before, 'top.0' against 'top.fc.0' left most sites of a
    real placement in bf16 in the simulator, without a word."""
    w = _variant(name)
    real = _real_linears(w)
    sim = {m: (s.k, s.n) for s in dense_sites(w, 64) for m in s.module_names}
    assert sum(len(s.module_names) for s in dense_sites(w, 64)) == len(sim)  # no module twice
    # the same modules in the same shapes (a Wukong's dense features were one embedding here, 2-8 there)
    assert sim == {n: (m.in_features, m.out_features) for n, m in real.items()}


def _real_dense_pass(w: Workload, batch: int) -> tuple[int, dict[str, bool]]:
    """The real dense part run on the meta device (no memory): the elements its LayerNorms read, and per
    linear module whether a ReLU reads its output (a functional F.relu, seen through its caller's MLP)."""
    import torch

    from cubic.core.models import MLP, build_dense

    with torch.device("meta"):
        dense = build_dense(w)
    normed = [0]
    hooks = [m.register_forward_hook(lambda mod, inp, out: normed.__setitem__(0, normed[0] + inp[0].numel()))
             for m in dense.modules() if isinstance(m, torch.nn.LayerNorm)]
    relu_after = {f"{prefix}.fc.{j}" if prefix else f"fc.{j}": m.last_act or j < len(m.fc) - 1
                  for prefix, m in dense.named_modules() if isinstance(m, MLP) for j in range(len(m.fc))}
    embs = {t.name: torch.empty(batch, t.dim, device="meta") for t in w.tables}
    dense(torch.empty(batch, w.data.num_dense_features, device="meta"), embs)
    for h in hooks:
        h.remove()
    return normed[0], relu_after


@pytest.mark.parametrize("name", VARIANTS)
def test_dense_sites_norms_and_activations_are_the_real_models(name):
    """The simulator prices the LayerNorms the real model runs (a Wukong FMB's always, a layer's output
    norm when layer_norm) and a ReLU exactly after the linear sites the model follows with one: before,
    the FMB's norm was priced only with layer_norm, and a DLRM without dense features had a top input d
    too wide."""
    w, batch = _variant(name), 64
    normed, relu_after = _real_dense_pass(w, batch)
    sites = dense_sites(w, batch)
    assert sum(s.m * s.k for s in sites if s.norm_before) == normed
    sim_relu = {m: s.act_after == "relu" for s in sites for m in s.module_names}
    assert sim_relu == {n: relu_after.get(n, False) for n in _real_linears(w)}


def test_a_mixed_placement_of_batched_projections_is_priced_as_placed():
    """The per-table projections of one dim are one batched GEMM in the simulator; a placement that puts
    some of them in FP8 is priced with those in FP8 (before: all of them in the base precision)."""
    w = DEFAULT_WORKLOADS["wukong-small"]
    real = _real_linears(w)
    batched = next(s for s in dense_sites(w, 64) if len(s.modules) >= 2)
    one = batched.modules[0]

    def placed(names) -> Config:
        sites = {f"dense.{n}": {"m": 64, "k": real[n].in_features, "n": real[n].out_features,
                                "recipe": "tensorwise", "kernel": "scaled_mm_tensorwise"} for n in names}
        doc = {"version": 1, "workload": w.name, "sites": sites, "module_filter": sorted(sites)}
        return cfg(fp8=FP8Choice(policy="placement", placement=doc))

    n_sites = len(real) + sum(1 for s in dense_sites(w, 64) if s.kind == "bmm")
    mixed = predict_step(w, placed([one]), H100, 64)
    assert mixed.dense["site_precisions"] == {"fp8": 1, "bf16": n_sites - 1}
    whole = predict_step(w, placed(batched.modules), H100, 64)
    assert whole.dense["site_precisions"] == {"fp8": len(batched.modules), "bf16": n_sites - len(batched.modules)}
    none = predict_step(w, cfg(), H100, 64)
    # the same GEMM work, only the placed rows' precision moves
    assert mixed.dense["flops_fwd_per_rank"] == none.dense["flops_fwd_per_rank"]
    times = [p.phases_s["dense_fwd"] + p.phases_s["dense_bwd"] for p in (none, mixed, whole)]
    assert times[0] != times[1] != times[2]


def test_a_probed_placement_is_simulated_site_for_site():
    from cubic.core.config import Kernels as K

    w = DEFAULT_WORKLOADS["dmt-small"]
    real = _real_linears(w)
    big = {n: m for n, m in real.items() if m.in_features >= 16 and m.out_features >= 16}
    doc = {"version": 1, "workload": w.name, "module_filter": sorted(f"dense.{n}" for n in big),
           "sites": {f"dense.{n}": {"m": 64, "k": m.in_features, "n": m.out_features, "recipe": "rowwise",
                                   "kernel": "scaled_mm_rowwise"} for n, m in big.items()}}
    assert 0 < len(big) < len(real)  # bottom.fc.0 (13 dense features) and top's last layer are small
    c = Config(kernels=K(dense_dtype="bf16"), sharding=ShardingChoice(planner="sim"),
               fp8=FP8Choice(policy="placement", placement=doc))
    placed = predict_step(w, c, H100, 64).dense["site_precisions"]
    everywhere = predict_step(w, c.model_copy(update={"fp8": FP8Choice(policy="all")}), H100, 64).dense
    # every site the real model has in FP8 is FP8 in the simulator: the same count as policy "all"
    assert placed.get("fp8") == len(big) == everywhere["site_precisions"]["fp8"]
    # a small site the placement puts in FP8 is FP8 here too (the size rule is policy "all"'s)
    every = {**doc, "module_filter": sorted(f"dense.{n}" for n in real),
             "sites": {f"dense.{n}": {**doc["sites"]["dense.top.fc.0"], "k": m.in_features, "n": m.out_features}
                       for n, m in real.items()}}
    c_every = c.model_copy(update={"fp8": FP8Choice(policy="placement", placement=every)})
    assert predict_step(w, c_every, H100, 64).dense["site_precisions"] == {"fp8": len(real)}
    # a site the model lacks is refused, as a real run refuses it, not simulated in bf16
    bad = {**doc, "sites": {**doc["sites"], "dense.top.fc.9": doc["sites"]["dense.top.fc.0"]},
           "module_filter": sorted([*doc["module_filter"], "dense.top.fc.9"])}
    with pytest.raises(SpecError, match="^fp8.placement.sites.dense.top.fc.9: the model has no linear site"):
        predict_step(w, c.model_copy(update={"fp8": FP8Choice(policy="placement", placement=bad)}), H100, 64)


def test_greedy_plan_covers_every_table_exactly_once():
    """The simulator's planner is the registered `greedy` Planner (sharding.greedy) reached through the
    one plan path; its plans are valid Plans (Plan's validator: every table covered once)."""
    from cubic.runners.step_model import cluster_plan

    w = mid_workload()
    for G in (8, 64):
        plan = cluster_plan(w, Config(), H100, G, 60e9)
        assert plan.planner == "greedy" and plan.group_size == G
        for t in w.tables:
            mine = [s for s in plan.shards if s.table == t.name]
            assert sum(s.rows * s.cols for s in mine) == t.rows * t.dim
            assert len({s.rank for s in mine}) == len(mine)  # pieces on distinct ranks


def test_explicit_plan_document_is_used():
    w = mid_workload()
    shards = [{"table": t.name, "sharding_type": "table_wise", "rank": 0, "rows": t.rows, "cols": t.dim}
              for t in w.tables[:60]]
    shards += [{"table": t.name, "sharding_type": "table_wise", "rank": 1, "rows": t.rows, "cols": t.dim}
               for t in w.tables[60:]]
    doc = {"version": 1, "planner": "manual", "world_size": 2, "group_size": 2, "batch_size": w.batch_size,
           "topology": {"world_size": 2}, "tables": [t.model_dump() for t in w.tables], "shards": shards}
    p = predict_step(w, Config(kernels=BF16, sharding=ShardingChoice(planner="manual", plan=doc)), H100, 2)
    assert p.plan["planner"] == "manual" and p.plan["shards"] == len(w.tables)
    # the one plan parser (sharding.types.plan_from_dict): a table without a shard is named
    bad = dict(doc, shards=shards[:-1])
    with pytest.raises(SpecError, match=f"config.sharding.plan.*{w.tables[-1].name}"):
        predict_step(w, Config(sharding=ShardingChoice(planner="manual", plan=bad)), H100, 2)
    # a valid plan of other tables than the workload's is refused, naming the table
    other = dict(doc, tables=[t.model_dump() for t in w.tables[:-1]], shards=shards[:-1])
    with pytest.raises(SpecError, match="does not place"):
        predict_step(w, Config(sharding=ShardingChoice(planner="manual", plan=other)), H100, 2)
    # a summary without the plan schema's fields (topology, tables) is not a plan
    summary = {k: doc[k] for k in ("version", "planner", "world_size", "group_size", "shards")}
    with pytest.raises(SpecError, match="config.sharding.plan"):
        predict_step(w, Config(sharding=ShardingChoice(planner="manual", plan=summary)), H100, 2)


def test_sharding_package_planner_is_used_by_name():
    pytest.importorskip("sharding.planners")
    w = mid_workload()
    p = predict_step(w, Config(kernels=BF16, sharding=ShardingChoice(planner="lookup_greedy")), H100, 16)
    assert p.plan["planner"] == "lookup_greedy" and not p.oom and p.step_s > 0
    with pytest.raises(SpecError):
        predict_step(w, Config(kernels=BF16, sharding=ShardingChoice(planner="no_such_planner")), H100, 16)


def test_plan_document_round_trips_through_the_sharding_schema():
    from cubic.runners.step_model import plan_document

    w = mid_workload()
    c = cfg()
    doc = plan_document(w, c, H100, 64)
    pinned = predict_step(w, c.model_copy(update={"sharding": ShardingChoice(plan=doc)}), H100, 64)
    assert pinned.step_s == pytest.approx(predict_step(w, c, H100, 64).step_s)
    from sharding.types import plan_from_dict

    plan = plan_from_dict(doc)  # a full plan document: what `cubic shard export/evaluate` read
    assert len(plan.shards) == len(doc["shards"]) and plan.world_size == 64 and plan.topology.device == H100.device.name


def test_a_placement_run_says_its_own_recipes_and_how_many_sites():
    """The simulated run's note states the placement's recipes (not fp8.recipe, which a placement's sites
    do not use) and how many GEMM sites the prediction put in FP8."""
    from cubic.runners.sim import dense_precision

    doc = {"version": 1, "workload": "w", "module_filter": ["dense.top.fc.0"],
           "sites": {"dense.top.fc.0": {"m": 64, "k": 256, "n": 256, "recipe": "rowwise_with_gw_hp",
                                        "kernel": "scaled_mm_rowwise"}}}
    c = cfg(fp8=FP8Choice(policy="placement", placement=doc))
    text = dense_precision(c, {"fp8": 1, "bf16": 8})
    assert text == "dense bf16, FP8 (rowwise_with_gw_hp) where the placement puts it: 1 of 9 GEMM sites"
    assert dense_precision(cfg(fp8=FP8Choice(policy="all", recipe="rowwise"))) == (
        "dense bf16, FP8 (rowwise) where fp8.policy all puts it")
