"""The training entry point, started the way TorchRec jobs are started:

    torchrun --standalone --nproc-per-node 2 -m cubic.runners.launch --workload wukong-small --steps 200 \\
        [--plan plan.json] [--config cfg.yaml] --json r.json
    python -m cubic.runners.launch --workload dlrm-small --steps 50          # one process

Each process reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the environment
(torchrun sets them; absent = one process), initialises torch.distributed (gloo on CPU, NCCL on
CUDA) and runs :func:`cubic.runners.distributed.run_worker`. Rank 0 makes the plan when none is
given (``--plan`` or the config's ``sharding.planner``, default ``size_lookup_greedy``) and
broadcasts it, and writes the Result JSON (``--json``, else stdout). ``--check-single`` (default
for runs of up to 300 steps on more than one rank, without FP8) also trains the single-process reference on rank
0 and records whether the two agree within the stated tolerance. :class:`DistributedRunner` starts
this same module W times (``--request``: its request file) with the environment torchrun would set.

A plan made with ``--group-size G`` (G < WORLD_SIZE) trains 2D sparse parallelism: WORLD_SIZE/G
replicas of a G-rank group, kept in step by the config's ``sharding.sync`` / ``sync_interval``
(see :mod:`cubic.runners.distributed`).

Exit codes: 0 ok, 1 a failed run (rank 0 still writes its Result) or a failed rank, 2 bad input
(one line on stderr naming the file and field or the flag).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cubic.runners.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", metavar="NAME|FILE", help="an embedded default name or a workload file")
    p.add_argument("--config", metavar="FILE", help="co-design config (JSON or YAML)")
    p.add_argument("--plan", metavar="FILE", help="a sharding plan document (JSON) for WORLD_SIZE ranks")
    p.add_argument("--steps", type=int, default=50, help="timed training steps (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps (default 5)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N", help="evaluate every N steps")
    p.add_argument("--device", default="cpu", help="cpu, cuda (this rank's LOCAL_RANK device) or auto")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads per rank")
    p.add_argument("--check-single", action=argparse.BooleanOptionalAction, default=None,
                   help="also train the single-process reference on rank 0 and compare")
    p.add_argument("--json", dest="json_out", metavar="OUT", help="rank 0 writes the Result JSON here")
    p.add_argument("--request", metavar="FILE", help=argparse.SUPPRESS)  # DistributedRunner's request
    return p


def _inputs(args):
    """(workload, config, steps, warmup, device, check_single, versions, threads) from flags or a request."""
    from cubic.core.config import Config, load_config
    from cubic.core.spec import SpecError, Workload
    from cubic.core.workloads import load_workload

    if args.request:
        req = json.loads(open(args.request).read())
        return (Workload.model_validate(req["workload"]), Config.model_validate(req["config"]), req["steps"],
                req["warmup"], req.get("device", "cpu"), req.get("check_single"), req.get("versions"),
                req.get("threads"))
    if not args.workload:
        raise SpecError("required", field="--workload")
    if args.steps < 1 or args.warmup < 0:
        raise SpecError("steps must be >= 1 and warmup >= 0", field="--steps")
    workload = load_workload(args.workload)
    config = load_config(args.config) if args.config else Config()
    # the same checks as `cubic run --world-size`, before any process group: a misfit is bad input on
    # every rank (exit 2), not a failed run written by rank 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.config:
        import warnings

        from cubic.runners.base import PricedSyncWarning, check_run_config

        with warnings.catch_warnings():
            if int(os.environ.get("RANK", "0")) != 0:  # one job, one warning: rank 0 says it
                warnings.simplefilter("ignore", PricedSyncWarning)
            check_run_config(config, None if args.plan or world == 1 else world, args.config, world_flag="WORLD_SIZE")
    if args.plan:
        from cubic.runners.distributed import config_with_plan

        config = config_with_plan(workload, config, args.plan, world, args.config)
    config.apply(workload, source=args.config)
    return workload, config, args.steps, args.warmup, args.device, args.check_single, None, args.threads


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.environ.get("CUBIC_PARENT_PID"):  # started by DistributedRunner: never outlive it
        from cubic.runners._child import die_with_parent

        die_with_parent(int(os.environ["CUBIC_PARENT_PID"]))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    from cubic.core.spec import SpecError

    try:
        workload, config, steps, warmup, device, check_single, versions_info, threads = _inputs(args)
    except (SpecError, ValueError, OSError) as e:
        print(f"launch: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist

    from cubic.core.result import Result
    from cubic.runners.distributed import check_plan, make_plan, run_worker
    from cubic.runners.base import classify_exception, resolve_device, result_header
    from cubic.runners.local import resolve_fp8

    if threads:
        torch.set_num_threads(int(threads))
    result = None
    try:
        plan = None
        if world > 1:
            cuda = resolve_device(device).startswith("cuda")
            if cuda:
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world,
                                    timeout=timedelta(minutes=10))
            box: list = [None, None]
            if rank == 0:  # one plan and one FP8 placement for every rank, whatever made them
                try:
                    plan = make_plan(workload, config, world)
                    why = check_plan(config.apply(workload), plan, world, config)
                    box = [plan.model_dump_json() if why is None else "invalid: " + why,
                           resolve_fp8(config, workload).model_dump_json() if why is None else None]
                except (SpecError, ValueError, KeyError) as e:
                    box = ["invalid: " + " ".join(str(e).split()), None]
            dist.broadcast_object_list(box, src=0)
            if box[0].startswith("invalid: "):
                dist.destroy_process_group()
                if rank == 0:
                    result = Result.failed("invalid", box[0][len("invalid: "):], **result_header(workload, config))
                    return _write(result, args.json_out)
                return 1
            from cubic.core.config import FP8Choice
            from sharding.types import Plan

            plan = Plan.model_validate_json(box[0])
            fp8_choice = FP8Choice.model_validate_json(box[1])
        else:
            fp8_choice = resolve_fp8(config, workload)
        result = run_worker(workload, config, plan, steps=steps, warmup=warmup, rank=rank, world=world,
                            device=device, eval_every=args.eval_every, check_single=check_single,
                            versions_info=versions_info, fp8_choice=fp8_choice)
    except Exception as e:  # noqa: BLE001 -- rank 0 reports every failure as data
        if rank != 0:
            raise
        kind, reason = classify_exception(e)
        result = Result.failed(kind, reason, **result_header(workload, config))
    if rank != 0:
        return 0
    return _write(result, args.json_out)


def _write(result, path: str | None) -> int:
    text = result.model_dump_json(indent=2) + "\n"
    if path:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # a reader never sees half a file
    else:
        sys.stdout.write(text)
    return 0 if result.ok else 1


if __name__ == "__main__":
    from cubic.runners._child import exit_without_teardown

    # a rank's interpreter teardown with gloo's threads can abort ("terminate called without an
    # active exception"), and a rank that dies reads as a failed run whose other ranks are killed
    exit_without_teardown(main())
