"""A job with KNOWN noise, for the answer's calibration (experiments/answer_calibration.py) and tests.

``python experiments/_noisy_job.py --a 4 [--noise 0.05] [--table NAME]`` prints one JSON line
``{"qps": true_qps(a) x exp(N(0, noise))}``: its throughput is a known function of its knob times
lognormal noise drawn fresh in every process (seeded from the OS), as a real job's run-to-run noise
is. No torch: a run takes well under a second, so a campaign of it measures the answer's logic,
not the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys

# true median qps by knob value: two near-ties at the top (4 vs 5: 3% apart), so "separated" is tested
TABLES = {"default": {1: 60.0, 2: 80.0, 3: 92.0, 4: 100.0, 5: 97.0, 6: 70.0},
          # a clear winner (100 vs 80): a confirm step should separate it
          "clear": {1: 60.0, 2: 80.0, 3: 70.0, 4: 100.0, 5: 75.0, 6: 50.0},
          # the space's default point (a=1) is the best: the answer must say keep the baseline
          "baseline_best": {1: 100.0, 2: 80.0, 3: 92.0, 4: 70.0, 5: 60.0, 6: 50.0}}


# the job's search space, as a campaign over it is given one (its one knob)
SPACE = """
version: 1
name: noisy
objectives: [{metric: qps, direction: maximize}]
parameters:
  - {name: a, type: categorical, choices: [1, 2, 3, 4, 5, 6]}
"""
PATH = __file__  # the script, for a campaign's --objective
NOISE = 0.05  # the calibrations' sd of log(qps) between processes


def command(table: str = "default", noise: float = NOISE) -> str:
    """The job as a campaign's ``--objective`` runs it (``{a}`` is the knob's placeholder): one command line
    for every calibration and test that runs it."""
    return f"{sys.executable} {PATH} --a {{a}} --noise {noise} --table {table}"


def true_qps(a: int, table: str = "default") -> float:
    return TABLES[table][int(a)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", type=int, required=True)
    p.add_argument("--noise", type=float, default=NOISE, help="sd of log(qps) between processes")
    p.add_argument("--table", default="default", choices=sorted(TABLES))
    args = p.parse_args()
    rng = random.Random()  # seeded from the OS: a fresh draw per process
    print(json.dumps({"qps": true_qps(args.a, args.table) * math.exp(rng.gauss(0.0, args.noise))}))


if __name__ == "__main__":
    main()
