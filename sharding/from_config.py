"""The one plan path: a (workload, config, world size) -> a :class:`~sharding.types.Plan`, for every
runner (local, distributed, TorchRec) and the simulator.

- ``config.sharding.plan`` (an explicit plan document) is parsed and checked against the workload's
  tables and the world size;
- otherwise ``config.sharding.planner`` names a planner of ``sharding.registry``; ``none`` (and the
  simulator's old names ``sim``/``sim-greedy``, and ``""``) mean :data:`DEFAULT_PLANNER`, the same
  for every runner: the greedy cost-balancing planner (``sharding.greedy``), cheap and
  model-free on GPU topologies.

Out-of-memory is a :class:`~sharding.types.PlanDoesNotFit` (a SpecError), whatever the planner.
"""

from __future__ import annotations

from cubic.core.config import Config
from cubic.core.spec import SpecError, Topology, Workload
from sharding.estimate import Estimator
from sharding.types import NONE_NAMES, Plan, ReplicaSync, plan_from_dict

DEFAULT_PLANNER = "greedy"


def planner_name(config: Config) -> str:
    """The planner a config asks for, with ``none`` resolved (one rule for every runner)."""
    name = config.sharding.planner
    return DEFAULT_PLANNER if name in NONE_NAMES else name


def plan_for(workload: Workload, config: Config, world_size: int, *, topology: Topology | None = None,
             target: str = "any", estimator: Estimator | None = None, sync: ReplicaSync | None = None,
             **planner_kw) -> Plan:
    """The plan a config runs with on ``world_size`` ranks: its explicit plan, else its planner's.

    ``topology``: the cluster (default: the workload's, with ``world_size`` ranks on one node).
    ``target="torchrec"``: only shapes TorchRec executes as planned. The config is applied to the
    workload first (its batch size and table overrides)."""
    wl = config.apply(workload)
    if config.sharding.plan:
        plan = plan_from_dict(config.sharding.plan, source="config.sharding.plan")
        if plan.world_size != world_size:
            raise SpecError(f"the plan is for {plan.world_size} ranks, the run has {world_size}",
                            field="config.sharding.plan.world_size")
        return plan
    if topology is None:
        from sharding.inputs import topology_for

        topology = topology_for(world_size, None, wl, ranks_per_node=world_size)
    from sharding.registry import make_planner

    planner = make_planner(planner_name(config), estimator=estimator, target=target, **planner_kw)
    # a 2D plan is priced with the sync the job runs: the config's (``sync`` when the caller resolved it)
    sync = sync or ReplicaSync.of(config.sharding.sync, config.sharding.sync_interval)
    return planner.plan(wl.tables, topology, wl.batch_size, config.sharding.group_size, sync)
