"""A user's training script for the early-stopping benchmark (experiments/_search_early_stop.py).

It trains nothing: each "epoch" sleeps ``--epoch-s`` seconds (a stand-in for the work, so that the
wall time a pruner saves is the epochs it skipped, not this machine's load) and prints the
validation loss that experiments/_public_problems gives this configuration after that epoch
(``--curves ordered``: mlp_curve; ``crossing``: mlp_curve_crossing, the same final losses on paths
that cross), as an intermediate line cubic's pruners read (``{"step": e, "val_loss": v}``); the
last line is the final metric. Run as a campaign's ``--objective``, as a user's own script would be.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments._public_problems import CURVES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--opt", required=True)
    ap.add_argument("--epoch-s", type=float, default=0.2)
    ap.add_argument("--curves", choices=tuple(CURVES), default="ordered")
    a = ap.parse_args()
    curve = CURVES[a.curves]({"lr": a.lr, "batch": a.batch, "width": a.width, "opt": a.opt})
    for epoch, loss in enumerate(curve, start=1):
        time.sleep(a.epoch_s)
        print(json.dumps({"step": epoch, "val_loss": loss}), flush=True)
    print(json.dumps({"val_loss": curve[-1], "epochs": len(curve)}), flush=True)


if __name__ == "__main__":
    main()
