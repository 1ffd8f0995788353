"""The names a campaign's ``--strategy`` takes: one list for the CLI, the campaign worker and
:func:`search.strategies.make_strategy` (kept apart from the strategies themselves, which import
Optuna and SciPy, so that reading a command line stays fast)."""

STRATEGIES = ("cubic", "cubic-tpe", "cubic-gp", "cubic-nsga2", "tpe", "gp", "random", "prior-order")
# what a campaign's --baselines run beside it (as NAME-random, ...): prior-order only where the campaign's runs
# have a step model (cubic.codesign.prior.StepModelPrior.available), the report plots each one it finds
BASELINES = ("random", "tpe", "prior-order")
