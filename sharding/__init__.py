"""Sharding plans for embedding tables (issue 3).

Stages, as in TorchRec's planner: ``types`` (Shard, ShardingOption, Storage, Plan + JSON schema),
``enumerate`` (options per table, input checks), ``estimate`` (features, learned/measured cost of a
plan, lower bound), ``planners`` (five baselines and cubic's search; ``greedy``, the default;
``torchrec_adapter`` for TorchRec's planner, export and validation), ``registry`` (every planner by
name), ``from_config`` (the one path from a config to a plan), ``kernels`` (compute kernels and
memory tiers per table). Ground truth: ``measure`` (FBGEMM CPU TBE timing) and ``comm``
(alpha-beta all-to-all model calibrated with gloo). ``collect`` gathers cost-model training data;
``distributed`` is the real multi-process training check (``DistributedRunner``); ``cli`` adds
``cubic shard``. Submodules are imported on use so that ``cubic --help`` stays fast.
"""
