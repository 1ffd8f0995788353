"""The names a campaign's ``--strategy`` takes: one list for the CLI, the campaign worker and
:func:`search.strategies.make_strategy` (kept apart from the strategies themselves, which import
Optuna and SciPy, so that reading a command line stays fast)."""

STRATEGIES = ("cubic", "cubic-tpe", "cubic-gp", "cubic-nsga2", "tpe", "gp", "random")
