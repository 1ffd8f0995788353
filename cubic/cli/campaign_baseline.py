"""The campaign's baseline (``cubic campaign run``/``resume``): what to measure as the baseline, its
run, its noise floor, and the (evaluate, point) pair the confirm step's speedup is measured against."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def base_config(kind: str):
    """What a campaign's runs start from before the space's knobs are set: the simulator's default
    config on a simulated cluster (as `cubic run --simulate`), else cubic's Config()."""
    from cubic.core.config import Config

    if kind == "simulated":
        from cubic.cli.common import runner_part

        return runner_part("cubic.runners.sim", "default_config", "the simulated cluster", "--simulate")()
    return Config()


def baseline_spec(args: argparse.Namespace, space, workload) -> dict[str, Any]:
    """What to measure as the baseline, read and checked before any run."""
    from cubic.codesign.answer import default_point, read_baseline_point

    if args.objective:
        point = read_baseline_point(args.baseline, space) if args.baseline else default_point(space)
        return {"point": point, "label": args.baseline or f"the space's default point {point}"}
    from cubic.cli.common import load_checked_config

    processes = None if args.simulate else args.world_size
    cfg = load_checked_config(args.baseline, processes) if args.baseline else base_config("simulated" if args.simulate else "local")
    wl = cfg.apply(workload)
    arch, dumped = wl.dense_arch.model_dump(mode="json"), cfg.model_dump(mode="json")
    shown = {}
    for name in space.param_names:  # the baseline's value of each knob, as the run resolves it
        if name == "batch_size":
            shown[name] = wl.batch_size
        elif name.startswith("model."):
            shown[name] = arch.get(name[len("model."):])
        else:
            node: Any = dumped
            for part in name.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            shown[name] = node
    return {"point": {}, "config": cfg, "shown": shown,
            "label": args.baseline or f"the workload's defaults ({workload.name}, "
                                      f"{'the simulator default config' if args.simulate else 'cubic Config()'})"}


def spec_to_context(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The baseline spec as plain JSON, kept in the campaign's context so that `campaign resume` of a
    campaign stopped before its baseline finished measures the same baseline (it resumed with none:
    no noise floor, an unpaired speedup)."""
    if spec is None:
        return None
    cfg = spec.get("config")
    return {"label": spec["label"], "point": dict(spec.get("point") or {}), "shown": spec.get("shown"),
            "config": cfg.model_dump(mode="json") if cfg is not None else None}


def spec_from_context(ctx: dict[str, Any]) -> dict[str, Any] | None:
    """The baseline spec a campaign was started with (None: --no-baseline, or a campaign stored before
    the spec was kept)."""
    raw = ctx.get("baseline")
    if not isinstance(raw, dict) or "label" not in raw:
        return None
    from cubic.core.config import Config
    from cubic.core.spec import parse_model

    cfg = raw.get("config")
    return {"label": raw["label"], "point": dict(raw.get("point") or {}), "shown": raw.get("shown"),
            "config": parse_model(Config, cfg, source="campaign context") if cfg is not None else None}


def baseline_cannot_run(doc: dict[str, Any]) -> bool:
    """A baseline that crashed (``error``: not a timeout or kill, which may pass, nor an OOM, NaN or
    infeasible value, which are properties of that configuration) means the job itself is broken and
    every run likely fails the same way: stop with one line before spending the budget."""
    if doc.get("ok", False) or (doc.get("failure_kind") or "error") != "error":
        return False
    if (doc.get("reason") or "").startswith("StoreError"):  # the store failed, not the job: runs go pending
        return False
    why = " ".join((doc.get("reason") or "").split())[:300]
    print(f"cubic: error: the baseline failed ({doc.get('failure_kind') or 'error'}: {why}); "
          "fix the job and run again (nothing else was run)", file=sys.stderr)
    return True


def measure_baseline(c, evaluate, space, spec: dict[str, Any]):
    """Measure the baseline; returns (its evaluate, its point, ok, its record) for the noise floor, the
    confirm step's speedup and whether the job can run at all."""
    if spec.get("config") is None:
        doc = c.measure_baseline(spec["point"], spec["label"])
        _said(doc, space)
        return evaluate, spec["point"], bool(doc.get("ok")), doc
    from cubic.codesign.campaign import BASELINE_KEY

    ev = baseline_evaluate(evaluate, space, spec["config"])
    doc = c.measure_baseline({}, spec["label"], evaluate=ev, shown_point=spec["shown"])
    if "config" not in doc:  # winner.yaml is this config when nothing beats it
        doc = {**doc, "config": spec["config"].model_dump(mode="json")}
        c.study.set_user_attr(BASELINE_KEY, doc)
    _said(doc, space)
    return ev, {}, bool(doc.get("ok")), doc


def baseline_evaluate(evaluate, space, config):
    """The evaluate of a Config baseline: the campaign's runner and run settings with the baseline's
    Config under the space's values (one place, for campaign run and resume alike)."""
    from cubic.codesign.evaluate import RunnerEvaluate

    ev = RunnerEvaluate(evaluate.workload, evaluate.runner, space, steps=evaluate.steps, warmup=evaluate.warmup,
                        store=evaluate.store, campaign=evaluate.campaign, base_config=config)
    ev.budget_examples = evaluate.budget_examples  # its NE at the same equal budget as every run's
    return ev


def stored_baseline(c, evaluate, space):
    """The baseline a resumed campaign measured before it stopped, as the confirm step's (evaluate,
    point), so a resumed campaign's speedup is paired like an uninterrupted one's; None when it has
    none or it failed."""
    from cubic.codesign.campaign import BASELINE_KEY
    from cubic.core.config import Config

    doc = c.study.user_attrs.get(BASELINE_KEY) or {}
    if not doc.get("ok"):
        return None
    if doc.get("config") is None:
        return evaluate, doc.get("point") or {}
    return baseline_evaluate(evaluate, space, Config.model_validate(doc["config"])), {}


def ensure_noise_floor(base) -> None:
    """This machine's noise floor (or the job's), measured from the baseline when missing or stale."""
    ev, point, ok = base[:3]
    if ok and callable(getattr(ev, "ensure_noise_floor", None)):
        said = ev.ensure_noise_floor(point)
        if said:
            print(f"cubic: {said}", file=sys.stderr, flush=True)


def _said(doc: dict[str, Any], space) -> None:
    """The baseline's outcome, one line on stderr like a run's progress line."""
    from cubic.codesign.trials import PROVENANCE
    from cubic.codesign.progress import format_result
    from cubic.core.result import Result
    from cubic.core.spec import sanitize

    metrics, source = doc.get("metrics") or {}, doc.get("source") or "measured"
    pooled = {"pooled": {"estimates": {k: {"basis": b} for k, b in (doc.get("basis") or {}).items()}}}
    ev = (Result(status="ok", metrics=metrics, source=source, extra=pooled) if doc.get("ok", False) else
          Result.failed(doc.get("failure_kind") or "error", doc.get("reason") or "", metrics=metrics, source=source))
    violation = max((c.violation(ev.metrics) for c in space.constraints), default=0.0)
    print(sanitize(f"baseline ({doc.get('label')}): {format_result(ev, space, violation)}; "
                   f"{PROVENANCE.get(ev.source, ev.source)}"), file=sys.stderr, flush=True)
