"""Training data for the learned cost model: augmented rank shard sets labelled by measured cost.

Augmentation (NeuroShard's recipe, on cubic.core.workloads' table generator): each sample is a rank
holding a random subset of 1..``max_tables`` tables, some with their dim redrawn, some cut
column-wise (cols = dim / 2^j, multiples of 4) or row-wise (a 1/2^j row block), at a batch drawn
from ``batches``: 32..4096 per rank, because a global batch of 4096 over 64-128 ranks leaves 32-64
examples per rank (the large tasks), and a model fitted on 512..4096 only extrapolated there. The
label is the measured forward+backward ms of the set as one fused kernel
(sharding.measure). Table seeds start at ``TRAIN_SEED_BASE`` so that benchmark tasks (seeds
0..999) use tables the model never saw.

Samples go into the trial store's own table for them (``TrialStore.record_sharding_sample``,
table ``cubic_sharding_samples``): the sample's tables and shard ranges (so features can be
rebuilt), its batch, the measured compute ms and this machine's fingerprint.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from cubic.core.fingerprint import fingerprint, fingerprint_hash
from cubic.core.spec import Table, stable_hash
from cubic.core.workloads import DIM_CHOICES, generate_tables
from sharding.estimate import rank_features
from sharding.measure import ShardWork, measure_compute

TRAIN_SEED_BASE = 100_000


def augmented_sample(rng: np.random.Generator, index: int, max_tables: int = 24,
                     batches: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096)) -> tuple[list[ShardWork], int]:
    k = int(np.clip(np.round(np.exp(rng.uniform(0, np.log(max_tables)))), 1, max_tables))
    tables = generate_tables(k, seed=TRAIN_SEED_BASE + index, prefix=f"s{index}_")
    works = []
    for t in tables:
        if rng.random() < 0.3:
            t = t.model_copy(update={"dim": int(rng.choice(DIM_CHOICES))})
        u = rng.random()
        if u < 0.25 and t.dim >= 8:
            j = int(rng.integers(1, int(np.log2(t.dim // 4)) + 1))
            works.append(ShardWork(t, 0, t.rows, max(4, t.dim >> j)))
        elif u < 0.4 and t.rows >= 4:
            j = int(rng.integers(1, 4))
            n = t.rows >> j
            i = int(rng.integers(0, 1 << j))
            works.append(ShardWork(t, i * n, n if i < (1 << j) - 1 else t.rows - i * n, t.dim))
        else:
            works.append(ShardWork(t, 0, t.rows, t.dim))
    return works, int(rng.choice(batches))


def _sample_doc(works: list[ShardWork]) -> dict:
    tables = {w.table.name: w.table for w in works}
    return {"tables": [t.model_dump(mode="json") for t in tables.values()],
            "shards": [{"table": w.table.name, "row_offset": w.row_offset, "rows": w.rows, "cols": w.cols}
                       for w in works]}


def collect(n_samples: int, seed: int = 0, *, repeats: int = 3, store=None, start_index: int = 0,
            progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Measure ``n_samples`` augmented rank sets; record each in ``store`` (if given). Returns rows."""
    rng = np.random.default_rng([seed, 7])
    rows = []
    fp = fingerprint("cpu")
    for i in range(start_index, start_index + n_samples):
        works, batch = augmented_sample(rng, i + seed * 1_000_000)
        t0 = time.perf_counter()
        m = measure_compute(works, batch, repeats=repeats, warmup=1, seed=i)
        rows.append({"works": works, "batch": batch, "compute_ms": m["total_ms"], "wall_s": time.perf_counter() - t0})
        if store is not None:
            store.record_sharding_sample(sample_hash(works, batch), batch, _sample_doc(works),
                                         {"compute_ms": m["total_ms"], "fwd_ms": m["fwd_ms"], "bwd_ms": m["bwd_ms"],
                                          "repeats": float(m.get("repeats") or repeats)}, fp)
        if progress:
            progress(i - start_index + 1, n_samples)
    return rows


def samples_from_store(store) -> list[tuple[list[ShardWork], int, float]]:
    """(works, batch, measured ms) of every stored rank sample on this machine's fingerprint
    (another machine's timings would mislead this machine's model)."""
    out = []
    for row in store.sharding_samples(fingerprint_hash(fingerprint("cpu"))):
        doc = row["sample"]
        tables = {t["name"]: Table.model_validate(t) for t in doc["tables"]}
        works = [ShardWork(tables[s["table"]], s["row_offset"], s["rows"], s["cols"]) for s in doc["shards"]]
        out.append((works, int(row["batch_size"]), float(row["metrics"]["compute_ms"])))
    return out


def features_and_labels(samples) -> tuple[np.ndarray, np.ndarray]:
    X = np.stack([rank_features(w, b) for w, b, _ in samples])
    y = np.array([ms for _, _, ms in samples])
    return X, y


def sample_hash(works: list[ShardWork], batch: int) -> str:
    return stable_hash([w.key() for w in works] + [batch])
