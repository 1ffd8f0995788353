"""A user's torchao job applying a cubic FP8 placement with its own calls (reliability_inputs'
``job loaders`` class).

    python -m experiments.reliability._fp8_job PLACEMENT JOB_JSON

JOB_JSON: ``{"wrap": bool, "last_out": int, "one_call": str | null}``: the job's model is the
4-layer tower the placement names (sites "0", "2", "4", "6"), held as ``net`` inside the job's own
module when ``wrap``, its last layer ``last_out`` wide; the job converts it as README says (one
``convert_to_float8_training`` per filter of ``placement_filters(PLACEMENT, model=model)``, each
with its config), or, with ``one_call``, once with that recipe's config and
``module_filter_fn(placement, model=model)`` (a user who assumed one recipe). A placement refused
is ``cubic: <its line>`` and exit 2; a job whose converted modules are not the placement's sites in
their recipes, at the placement's shapes and with its Mods, is exit 1 (the defect the check exists
for); exit 0 when they are. On the code before stop 61 (a bare name filter in ``fp8.placement``) the
job does what it could then: filter by name and pass the config it had.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    import logging

    # torchao 0.18's import logs its CUDA-only libraries and a torch pytree deprecation on this CPU: a
    # job's log setting, quieted so that the line judged is cubic's
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from cubic.core.spec import SpecError
    from fp8.placement import load_placement

    path, spec = argv[0], json.loads(argv[1])
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(),
                        nn.Linear(48, spec["last_out"]))
    model, prefix = net, ""
    if spec["wrap"]:
        model, prefix = nn.Module(), "net."
        model.net = net
    try:
        placement = load_placement(path)
        try:
            from fp8.torchao_export import module_filter_fn, placement_filters
        except ImportError:  # before stop 61: a bare name filter, the same for every recipe
            from fp8.placement import module_filter_fn as bare

            def module_filter_fn(placement, recipe=None, *, model, source=None):  # noqa: ANN001, ANN202
                return bare(placement)

            def placement_filters(path, *, model):  # noqa: ANN001, ANN202
                out = []
                for recipe in sorted({s.recipe for s in placement.fp8_sites().values()}):
                    f = bare(placement)
                    f.config = lambda recipe=recipe: Float8LinearConfig.from_recipe_name(recipe)
                    out.append(f)
                return out
        if spec["one_call"]:
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(spec["one_call"]),
                                       module_filter_fn=module_filter_fn(placement, model=model, source=path))
        else:  # README's loop
            for f in placement_filters(path, model=model):
                convert_to_float8_training(model, config=f.config(), module_filter_fn=f)
    except SpecError as e:
        print(f"cubic: {e}", file=sys.stderr)
        return 2
    converted = {n.removeprefix(prefix): m for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    wrong = []
    for name, site in placement.fp8_sites().items():
        mod = converted.pop(name, None)
        if mod is None:
            wrong.append(f"{name}: not converted")
        elif mod.config != Float8LinearConfig.from_recipe_name(site.recipe):
            wrong.append(f"{name}: converted, not in {site.recipe}")
        elif (mod.in_features, mod.out_features) != (site.k, site.n):
            wrong.append(f"{name}: converted at {mod.in_features} x {mod.out_features}, placed at {site.k} x {site.n}")
        elif site.applied_mods:
            wrong.append(f"{name}: converted without its Mods")
    wrong += [f"{name}: converted, not placed" for name in converted]
    if wrong:
        print(f"the job ran: {'; '.join(wrong)}", file=sys.stderr)
        return 1
    print("converted exactly the placement's sites in their recipes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
