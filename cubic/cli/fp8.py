"""``cubic fp8 <verb>``: probe, model, check, kernels, export.

    cubic fp8 probe --workload wukong-small | --module pkg.mod:factory [--loss mse|bce|pkg.mod:fn]
                    --budget-sqnr 20 [--budget-scope model|site] [--budget-ne 0.02|off] --out fp8.json
                    [--no-require-fast] [--recipes torchao|all|R1,R2]
                    [--target-batch B] [--no-keep-first-last] [--no-unsure-margin] [--max-batches 24] [--stride 1] [--ci-db 1.0]
    cubic fp8 model --m M --k K --n N --recipe tensorwise|rowwise|rowwise_with_gw_hp|block128|mx32
                    [--mode compile|eager] [--norm-before] [--act-after sigmoid] [--explain] [--json]
                                                                            (modelled H100 times)
    cubic fp8 check --workload wukong-small --placement fp8.json [--steps 150] [--seeds N] [--json]
    cubic fp8 kernels --m M --k K --n N [--repeats 7] [--json]              (measured, this device)
    cubic fp8 export placement.json --format torchao [--out fp8_placement.py]   (apply with torchao)

Bad input raises SpecError/ValueError: one line on stderr, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from cubic.core.recipes import FP8_RECIPES, TORCHAO_RECIPES
from cubic.cli.common import int_at_most
from cubic.core.spec import MAX_BATCH_SIZE, MAX_REPEATS, MAX_STEPS, SpecError


def _threads() -> None:
    # one thread: the machine is usually shared, and two threads fighting other jobs are slower
    import torch

    torch.set_num_threads(1)


def _out_path(path: str) -> Path:
    p = Path(path)
    if p.parent and not p.parent.exists():
        raise SpecError("the directory does not exist", source=str(p), field="--out")
    return p


def _fits(workload, device: str) -> None:
    """Refuse, naming --workload, a workload whose tables and dense state cannot fit ``device`` (checked
    already: cubic.core.fingerprint.check_device) by the runner's own rule (cubic.runners.memory.preflight),
    before a model is built."""
    from cubic.core.config import Config
    from cubic.runners.memory import preflight

    why = preflight(workload, Config(), device=device)
    if why:
        raise SpecError(why.replace("infeasible, not started: the run", "the workload"), field="--workload")


def cmd_probe(args) -> int:
    from cubic.core.workloads import load_workload
    from fp8.placement import MAX_SQNR_DB
    from fp8.recommend import probe_module, recommend

    from cost_models.hardware import load_device

    _threads()
    out = _out_path(args.out) if args.out else None
    if args.budget_sqnr > MAX_SQNR_DB:  # the placement's schema would refuse it after the probe's minutes
        raise SpecError(f"at most {MAX_SQNR_DB:g} dB, got {args.budget_sqnr:g}", field="--budget-sqnr")
    load_device(args.target, field="--target")  # named as the flag, and before the probe's minutes
    w = load_workload(args.workload) if args.workload else None
    from cubic.core.fingerprint import check_device

    device = str(check_device(args.device))  # named as the flag the user typed (the probe names its argument)
    if w is not None:
        _fits(w, device)
    probe = None
    if args.module:
        probe = probe_module(args.module, max_batches=args.max_batches, ci_halfwidth_db=args.ci_db, loss=args.loss,
                             device=args.device)
    label = w.name if w is not None else args.module
    placement = recommend(w, args.budget_sqnr, probe=probe, label=label, require_fast=args.require_fast, target_device=args.target,
                          target_batch=args.target_batch, warmup_steps=args.warmup_steps,
                          max_batches=args.max_batches, ci_halfwidth_db=args.ci_db,
                          keep_first_last=args.keep_first_last, unsure_margin=args.unsure_margin,
                          probe_stride=args.stride, mods=args.mods, budget_scope=args.budget_scope, device=args.device,
                          recipes=args.recipes,
                          **({} if args.budget_ne == "default" else {"budget_ne_rel": args.budget_ne}))
    text = placement.model_dump_json(indent=2)
    if out:
        out.write_text(text + "\n")
    if args.json:
        print(text)
        return 0
    from cubic.cli.common import print_table

    batch = placement.probe.get("target_batch")
    rows = []
    for name, s in placement.sites.items():
        # the recipe whose numbers the decision used, and its verdict: the row agrees with the reason
        r = s.verdict_recipe or s.recipe
        e = s.error.get(r) if r else None
        err = f"{e.sqnr_db:.1f} [{e.ci_low_db:.1f}, {e.ci_high_db:.1f}]" if e else "-"
        ne = (f"{100 * e.ne_rel:+.3f} [{100 * e.ne_rel_ci_low:+.3f}, {100 * e.ne_rel_ci_high:+.3f}]"
              if e and e.ne_rel is not None else "-")
        # M of the batch the placement is for (--target-batch), the shape its speedup is predicted at
        rows.append([name, f"{s.m_target or s.m}x{s.k}x{s.n}", r or "-", s.verdict or ("safe" if s.safe else "-"),
                     "yes" if s.recipe else "no", s.kernel or "-",
                     ",".join(m.name for m in s.applied_mods) or "-", err, ne,
                     str(e.batches if e else 0), "yes" if s.fast else "no",
                     f"{s.predicted_speedup:.2f}x" if s.predicted_speedup else "-", s.reason or ""])
    dev = placement.probe_device
    # a --module's "NE" is the relative change of its own loss (--loss) over held-out batches, not NE
    cost = "NE" if w is not None else f"{args.loss} loss (relative change; --module)"
    print_table(f"FP8 placement for {label} (budget {args.budget_sqnr} dB per {placement.budget_scope}"
                + (f", held-out {cost} cost <= {100 * placement.budget_ne_rel:+.4f}%" if placement.budget_ne_rel
                   else "")
                + f"; SQNR measured on {dev} on the probe's batches, the {cost} cost on held-out data; speed "
                  f"modelled on {args.target}"
                + (f" at batch {batch}" if batch else "") + f"; kernels timed on {dev})",
                ["site", f"M x K x N (batch {batch})" if batch else "M x K x N", "recipe", "verdict", "FP8",
                 f"kernel ({dev}-timed)", "mods", "SQNR dB [95% CI]",
                 f"held-out {'NE' if w is not None else 'loss'} cost % [95% CI]", "batches",
                 f"fast ({args.target})", f"speedup ({args.target}, modelled)", "reason"],
                rows)
    counts = {v: sum(1 for s in placement.sites.values() if s.verdict == v) for v in ("safe", "inconclusive", "unsafe")}
    print("verdicts (each site alone, its recipe shown): " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    slow = slow_sites_line(placement, args.target, batch)
    if slow:
        print(slow)
    combined = (f"; combined SQNR lower bound {placement.model_sqnr_db:.1f} dB (modelled: noise powers add)"
                if placement.model_sqnr_db is not None else "")
    if placement.model_ne_rel is not None:
        c = placement.model_ne_rel
        combined += (f"; held-out NE cost together {100 * c['mean']:+.4f}% [{100 * c['ci_low']:+.4f}%, "
                     f"{100 * c['ci_high']:+.4f}%] (measured, forward only)")
    print(f"FP8 sites: {len(placement.module_filter)}/{len(placement.sites)}{combined}" + (f"; wrote {out}" if out else ""))
    from cost_models.gpu_gemm import check_line, model_check

    shown = tuple(sorted({r for s in placement.sites.values() if s.predicted_speedup
                          for r in [s.verdict_recipe or s.recipe] if r}))
    print(f"speed ({args.target}, modelled): "
          f"{check_line(args.target, model_check(), recipes=shown, device=load_device(args.target))}")
    from fp8.checked import check_line as quality_line, quality_check

    print(f"quality: {quality_line(quality_check())}")
    return 0


def slow_sites_line(placement, target: str, batch: int | None) -> str | None:
    """The safe sites predicted slow at the placement's batch, and the batch at which each would be
    predicted fast (SitePlacement.fast_from_batch, MODELLED); None when there are none."""
    from fp8.recommend import FAST_FROM_MAX_BATCH

    slow = {n: s for n, s in placement.sites.items() if s.safe_but_slow}
    if not slow:
        return None
    later = sorted(((s.fast_from_batch, n) for n, s in slow.items() if s.fast_from_batch), key=lambda x: (x[0], x[1]))
    # a word first: under the table, a line that starts with a number reads as a site's row
    head = (f"safe but slow: {len(slow)} site(s) predicted slower in FP8 on {target}"
            + (f" at batch {batch:,}" if batch else ""))
    tail = f"batch up to {FAST_FROM_MAX_BATCH:,} (under the model their K x N, not the batch, keeps FP8 from paying)"
    if not later:
        return head + f"; none is predicted faster at any {tail} (MODELLED)"
    shown = ", ".join(f"{n} from {b:,}" for b, n in later[:6]) + (f" and {len(later) - 6} more" if len(later) > 6 else "")
    rest = len(slow) - len(later)
    return (head + f"; predicted faster at a larger --target-batch (MODELLED, its recipe): {shown}"
            + (f"; {rest} at no {tail}" if rest else ""))


def cmd_model(args) -> int:
    from cost_models.gpu_gemm import block_speedup, check_line, linear_block_kernels, model_check
    from cost_models.hardware import load_device

    dev = load_device(args.device, field="--device")
    kw = dict(norm_before=args.norm_before, act_after=args.act_after, device=dev, fuse_casts=not args.no_fusion,
              mode=args.mode)
    r = block_speedup(args.m, args.k, args.n, args.recipe, **kw)
    checked = model_check()
    out = {
        "source": "modelled", "device": dev.name, "m": args.m, "k": args.k, "n": args.n, "recipe": args.recipe,
        "mode": args.mode, "norm_before": args.norm_before, "act_after": args.act_after,
        "fuse_casts": not args.no_fusion, "bf16_ms": r["bf16_ms"], "fp8_ms": r["fp8_ms"], "speedup": r["speedup"],
        "checked": checked, "trust": check_line(dev.name, checked, recipes=(args.recipe,), mode=args.mode, device=dev),
    }
    explain = args.breakdown or args.explain
    if explain:
        out["bf16_kernels"] = [k.__dict__ for k in linear_block_kernels(args.m, args.k, args.n, "bf16", None, **kw)]
        out["fp8_kernels"] = [k.__dict__ for k in linear_block_kernels(args.m, args.k, args.n, "fp8", args.recipe, **kw)]
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"modelled on {dev.name} ({args.mode}): fwd+bwd block {args.m}x{args.k}x{args.n}"
          f"{' [norm before]' if args.norm_before else ''}{f' [{args.act_after} after]' if args.act_after else ''}: "
          f"bf16 {r['bf16_ms']:.4f} ms, fp8 {args.recipe} {r['fp8_ms']:.4f} ms, speedup {r['speedup']:.2f}x")
    print(out["trust"])
    if args.explain:
        for label, ks in (("bf16", out["bf16_kernels"]), (f"fp8 {args.recipe}", out["fp8_kernels"])):
            total = sum(k["time_s"] for k in ks)
            print(f"  {label} kernels (modelled):")
            for k in ks:
                print(f"    {k['phase']:3s} {k['kind']:4s} {k['name']:36s} {k['time_s'] * 1e6:10.2f} us "
                      f"{100 * k['time_s'] / total:5.1f}%  {k['bytes'] / 1e6:10.2f} MB  {k['flops'] / 1e9:10.2f} GFLOP")
            by_kind: dict[str, float] = {}
            for k in ks:
                by_kind[k["kind"]] = by_kind.get(k["kind"], 0.0) + k["time_s"]
            print("    by kind: " + ", ".join(f"{kind} {t * 1e6:.1f} us" for kind, t in by_kind.items()))
    return 0


def cmd_check(args) -> int:
    from cubic.core.config import FP8Choice
    from cubic.core.spec import sanitize
    from cubic.core.workloads import load_workload
    from fp8.placement import load_placement
    from cubic.core.fingerprint import check_device
    from fp8.quality import paired_check

    _threads()
    w = load_workload(args.workload)
    device = str(check_device(args.device))
    _fits(w, device)
    variants = {}
    p = None
    if args.placement:
        from fp8.runtime import placement_misfit

        p = load_placement(args.placement)
        if misfit := placement_misfit(p, w):  # named in the placement file the user gave
            raise SpecError(misfit[1], source=args.placement, field=misfit[0])
        variants["placement"] = FP8Choice(policy="placement", placement=p.model_dump(mode="json"))
    if args.all:
        variants[f"all_{args.recipe}"] = FP8Choice(policy="all", recipe=args.recipe)
    if not variants:
        raise SpecError("give --placement and/or --all", field="--placement")
    seeds = list(range(args.seed, args.seed + args.seeds))
    r = paired_check(w, variants, args.steps, seeds, device=device)
    if args.json:
        print(json.dumps(r, indent=2, default=float))
        return 0
    base = [run["full_precision"] for run in r["runs"]]
    which = f"seed {args.seed}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
    print(f"{sanitize(w.name)}, {args.steps} steps, {which} (measured on {args.device}): full precision NE "
          + "/".join(f"{b['ne']:.5f}" for b in base[:4]) + (" ..." if len(base) > 4 else "")
          + (f" loss {base[0]['loss']:.5f}" if len(base) == 1 else ""))
    empty = p is not None and not p.fp8_sites()
    for name, v in r["ne_rel_diff"].items():
        if name == "placement" and empty:  # "+0.000%" would read as a finding
            print(f"  placement: no FP8 sites in {sanitize(args.placement)}: the model is the full-precision one")
        elif v["ci"] is None:
            one = r["runs"][0][name]
            print(f"  {name}: NE {one['ne']:.5f} ({100 * v['mean']:+.3f}% rel; one seed, no interval), loss "
                  f"{one['loss']:.5f} ({one['loss_diff']:+.5f})")
        else:
            zero = "includes 0: not resolved" if v["ci"][0] <= 0 <= v["ci"][1] else "excludes 0"
            lo, hi = (100 * x for x in v["ci"])
            print(f"  {name}: NE cost {100 * v['mean']:+.3f}% [95% CI {lo:+.3f}, {hi:+.3f}] over {v['seeds']} "
                  f"paired seeds ({zero})")
    # one seed's -1% is how "FP8 improves NE" gets believed
    if len(seeds) == 1 and set(variants) != ({"placement"} if empty else set()):
        print("one seed gives no interval: a difference of this size may be the seed's own noise; "
              "--seeds N (2 or more) trains each variant on N seeds and gives the paired 95% CI")
    return 0


def cmd_kernels(args) -> int:
    from cubic.core.spec import check_allocation

    # inputs, weights, output gradients and their results, fp32
    check_allocation(8 * (args.m * args.k + args.k * args.n + args.m * args.n),
                     f"a {args.m}x{args.k}x{args.n} GEMM", field="--m/--k/--n")
    from fp8.dispatch import Dispatcher
    from cubic.core.fingerprint import check_device
    from cost_models.gpu_gemm import check_line, model_check
    from fp8.kernels import H100_MODEL, modelled_h100_ms

    _threads()
    d = Dispatcher(repeats=args.repeats, device=str(check_device(args.device)))
    times = d.times(args.m, args.k, args.n)
    modelled = {k: t for k in d.kernels if (t := modelled_h100_ms(k, args.m, args.k, args.n)) is not None}
    modes = {k: H100_MODEL[k][1] for k in modelled if k in H100_MODEL}  # the casts' mode the model assumes
    trust = check_line("h100", model_check(), recipes=tuple(sorted({H100_MODEL[k][0] for k in modes})),
                       mode="eager" if "eager" in modes.values() else None)
    out = {"source": "measured", "device": str(d.device), "shape": [args.m, args.k, args.n],
           "times_ms": times, "unavailable": d.unavailable(args.m, args.k, args.n),
           "modelled_h100_ms": modelled, "modelled_h100_mode": modes,
           "modelled_h100_source": "modelled (cost_models/gpu_gemm.py), not measured", "modelled_h100_trust": trust}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in sorted(times.items(), key=lambda kv: kv[1]):
            h = (f"; H100 {modelled[k]:.4f} ms modelled" + (f" ({modes[k]} casts)" if k in modes else "")
                 if k in modelled else "")
            print(f"{k:30s} {v:9.3f} ms (fwd+bwd GEMMs, median of {args.repeats}, measured on {d.device}){h}")
        for k, why in out["unavailable"].items():
            h = (f" (H100 {modelled[k]:.4f} ms modelled" + (f", {modes[k]} casts" if k in modes else "") + ")"
                 if k in modelled else "")
            print(f"{k:30s} not timed here: {why}{h}")
        print(f"H100 times (modelled): {trust}")
    return 0


def cmd_export(args) -> int:
    from fp8.placement import load_placement
    from fp8.torchao_export import export_module, split_sites, torchao_plan

    out = _out_path(args.out) if args.out else None
    p = load_placement(args.placement)
    text = export_module(p, source=args.placement)
    if out is None:
        print(text, end="")
        return 0
    out.write_text(text)
    groups = {r: sum(1 for s in p.fp8_sites().values() if s.recipe == r) for r in TORCHAO_RECIPES}
    print(f"wrote {out}: {len(p.fp8_sites())}/{len(p.sites)} sites in FP8 ("
          + ", ".join(f"{n} {r}" for r, n in groups.items() if n) + "); in the job: "
          f"import {out.stem}; model = {out.stem}.apply(model)")
    split = split_sites(torchao_plan(p, args.placement))
    if split:
        print(f"split_outliers at {', '.join(split)}: torchao converts <site>.linear; the outlier input channels "
              "(picked on the job's first batch, kept in the state_dict) run in high precision beside it; "
              "a checkpoint saved after apply(model) loads after apply(model)")
    return 0


def _recipes(text: str) -> tuple[str, ...]:
    """``--recipes``: torchao, all, or comma-separated recipe names (cubic.core.recipes.recipe_set)."""
    from cubic.core.recipes import recipe_set

    try:
        return recipe_set(text)
    except ValueError as e:
        raise SpecError(str(e)) from None


def _ne_budget(text: str) -> float | str | None:
    """``--budget-ne``: a percentage (relative NE) returned as a fraction, ``off`` (None) or
    ``default`` (fp8.recommend's DEFAULT_BUDGET_NE_REL, the one place that number lives)."""
    if text in ("off", "default"):
        return None if text == "off" else text
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"not a number or 'off': {text!r}") from None
    if not (0.0 < v <= 100.0):
        raise SpecError(f"must be in (0, 100] percent, got {text}")
    return v / 100.0


def register(subparsers) -> None:
    from cubic.cli.common import nonnegative_int, positive_float, positive_int

    p = subparsers.add_parser("fp8", help="FP8 placement: probe, model, check, kernels")
    sub = p.add_subparsers(dest="fp8_command", metavar="<verb>", required=True)

    pr = sub.add_parser("probe", help="probe a workload and write an FP8 placement")
    src = pr.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="embedded workload name or YAML/JSON file")
    src.add_argument("--module", metavar="PKG.MOD:FACTORY",
                     help="any model: factory() -> (nn.Module, batch_fn(step) -> (inputs, targets)); see --loss")
    pr.add_argument("--loss", default="mse", metavar="mse|bce|PKG.MOD:FN",
                    help="the loss --module trains with: mse (default), bce (binary cross-entropy on logits), "
                         "or fn(output, target) -> scalar")
    pr.add_argument("--budget-sqnr", type=positive_float, required=True, metavar="DB",
                    help="a site is safe when its SQNR lower 95%% bound (worst of the 3 GEMMs) >= DB")
    pr.add_argument("--budget-scope", choices=("model", "site"), default="model",
                    help="model (default): the FP8 sites' noise together must also meet the budget (noise powers "
                         "add); site: each site on its own")
    pr.add_argument("--budget-ne", type=_ne_budget, default="default", metavar="PCT|off",
                    help="a site is safe only when the upper 95%% bound of its FP8 forward's NE cost on held-out "
                         "examples is <= PCT percent (with --budget-scope model: the FP8 sites together); "
                         "default 0.02; off: SQNR alone")
    pr.add_argument("--recipes", type=_recipes, default="all", metavar="torchao|all|R1,R2",
                    help="the FP8 recipes a site may be placed in: all (default), torchao (tensorwise, rowwise, "
                         "rowwise_with_gw_hp: what `cubic fp8 export --format torchao` needs), or names")
    pr.add_argument("--out", help="write the placement JSON here")
    pr.add_argument("--require-fast", action=__import__("argparse").BooleanOptionalAction, default=True,
                    help="FP8 only where the modelled target speedup > 1 (default: yes)")
    pr.add_argument("--target", default="h100", help="device of the speed model (h100, h200 or YAML)")
    pr.add_argument("--target-batch", type=int_at_most(MAX_BATCH_SIZE), help="batch size for the speed prediction")
    pr.add_argument("--keep-first-last", action=__import__("argparse").BooleanOptionalAction, default=True,
                    help="input layers (raw model inputs) and the last layer stay in high precision (default: yes)")
    pr.add_argument("--unsure-margin", action=__import__("argparse").BooleanOptionalAction, default=True,
                    help="a site whose interval did not narrow to --ci-db must clear the budget by that much "
                         "(default: yes)")
    pr.add_argument("--mods", action=__import__("argparse").BooleanOptionalAction, default=True,
                    help="probe sites whose statistics call for Mods again with them on, and apply them where "
                         "that makes the site safe or faster (default: yes; --workload only)")
    pr.add_argument("--warmup-steps", type=int_at_most(MAX_STEPS, low=0), default=30,
                    help="fp32 steps before probing (default 30)")
    pr.add_argument("--max-batches", type=int_at_most(MAX_STEPS), default=24, help="probe at most this many batches")
    pr.add_argument("--stride", type=positive_int, default=1,
                    help="measure one training step in STRIDE, so the batches span more of training (default 1)")
    pr.add_argument("--ci-db", type=positive_float, default=1.0, help="target CI half-width in dB (default 1)")
    pr.add_argument("--device", default="cpu", help="where the Probe trains and measures and Dispatch times "
                    "kernels: cpu (default), cuda or cuda:N")
    pr.add_argument("--json", action="store_true", help="print the placement JSON")
    pr.set_defaults(func=cmd_probe)

    mo = sub.add_parser("model", help="modelled H100 fwd+bwd time of a linear block, bf16 vs FP8")
    for d in ("m", "k", "n"):
        mo.add_argument(f"--{d}", type=positive_int, required=True)
    mo.add_argument("--recipe", choices=FP8_RECIPES,
                    default="tensorwise")
    mo.add_argument("--mode", choices=["compile", "eager"], default="compile",
                    help="torch.compile-fused casts (default) or eager PyTorch kernels")
    mo.add_argument("--norm-before", action="store_true", help="a LayerNorm feeds the linear")
    mo.add_argument("--act-after", choices=["sigmoid", "relu", "gelu", "silu"], help="activation after it")
    mo.add_argument("--device", default="h100", help="h100, h200 or a device YAML")
    mo.add_argument("--no-fusion", action="store_true", help="do not fuse casts into the norm/activation")
    mo.add_argument("--breakdown", action="store_true", help="include every kernel in --json")
    mo.add_argument("--explain", action="store_true", help="print the per-kernel breakdown (modelled)")
    mo.add_argument("--json", action="store_true")
    mo.set_defaults(func=cmd_model)

    ch = sub.add_parser("check", help="train with a placement and in full precision; compare NE and loss")
    ch.add_argument("--workload", required=True)
    ch.add_argument("--placement", help="placement JSON (from `cubic fp8 probe`)")
    ch.add_argument("--all", action="store_true", help="also train with every site in FP8")
    ch.add_argument("--recipe", choices=TORCHAO_RECIPES, default="tensorwise",
                    help="recipe for --all")
    ch.add_argument("--steps", type=int_at_most(MAX_STEPS), default=150)
    ch.add_argument("--seed", type=nonnegative_int, default=0, help="the first seed (default 0)")
    ch.add_argument("--seeds", type=int_at_most(MAX_REPEATS), default=1,
                    help="train each variant on this many seeds from --seed and give the paired 95%% CI of its "
                         "NE cost (default 1: one seed, no interval)")
    ch.add_argument("--device", default="cpu", help="train here: cpu (default), cuda or cuda:N")
    ch.add_argument("--json", action="store_true")
    ch.set_defaults(func=cmd_check)

    ex = sub.add_parser("export", help="write a placement as a Python module that applies it with torchao")
    ex.add_argument("placement", help="placement JSON (from `cubic fp8 probe --out`)")
    ex.add_argument("--format", choices=["torchao"], default="torchao",
                    help="torchao: a module with apply(model) (convert_to_float8_training per recipe)")
    ex.add_argument("--out", help="write the module here (default: stdout)")
    ex.set_defaults(func=cmd_export)

    ke = sub.add_parser("kernels", help="time every registered kernel for one linear shape (this device)")
    for d in ("m", "k", "n"):
        ke.add_argument(f"--{d}", type=positive_int, required=True)
    ke.add_argument("--repeats", type=int_at_most(MAX_REPEATS), default=7)
    ke.add_argument("--device", default="cpu", help="time the kernels here: cpu (default), cuda or cuda:N")
    ke.add_argument("--json", action="store_true")
    ke.set_defaults(func=cmd_kernels)
