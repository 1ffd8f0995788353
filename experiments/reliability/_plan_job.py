"""A user's TorchRec job loading a cubic plan (reliability_inputs' ``job loaders`` class).

    python -m experiments.reliability._plan_job PLAN MODEL_JSON

MODEL_JSON: ``{"at": "sparse.ebc", "tables": [[name, rows, dim], ...], "module_path": str | null}``:
the job's model holds an EmbeddingBagCollection at ``at`` beside a dense layer; the plan is loaded
as README says (``load_plan(PLAN, model=model)``) and DMP wraps the model on one gloo process. A
plan refused is ``cubic: <its line>`` and exit 2, as the CLI says it; a plan DMP ran with the
collection left unsharded is exit 1 (the defect the check exists for). On a ``load_plan`` without
``model=`` (before stop 60) the job does what it could then: pass the path and hope.
"""

from __future__ import annotations

import inspect
import json
import os
import sys


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel

    from cubic.core.spec import SpecError
    from cubic.runners.base import free_port
    from sharding.torchrec_adapter import load_plan

    path, spec = argv[0], json.loads(argv[1])
    model = torch.nn.Module()
    parent, _, leaf = spec["at"].rpartition(".")
    holder = model
    for part in filter(None, parent.split(".")):
        holder.add_module(part, torch.nn.Module())
        holder = getattr(holder, part)
    holder.add_module(leaf, EmbeddingBagCollection(tables=[EmbeddingBagConfig(
        name=n, embedding_dim=d, num_embeddings=r, feature_names=[f"f_{n}"]) for n, r, d in spec["tables"]],
        device=torch.device("meta")))
    model.dense = torch.nn.Linear(4, 4)
    try:
        if "model" in inspect.signature(load_plan).parameters:
            plan = load_plan(path, module_path=spec["module_path"], model=model, world_size=1, device="cpu")
        else:  # the loader before it took the model
            plan = load_plan(path, module_path=spec["module_path"] or "", world_size=1, device="cpu")
    except SpecError as e:
        print(f"cubic: {e}", file=sys.stderr)
        return 2
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan)
        kind = type(dmp.module.get_submodule(spec["at"])).__name__
    finally:
        dist.destroy_process_group()
    print(f"DMP ran; the collection at {spec['at']!r} is a {kind}", file=sys.stderr)
    return 0 if kind.startswith("Sharded") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
