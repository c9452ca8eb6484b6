"""Item review that does not cry wolf: false-flag share on clean data and top-k recall of
flipped items, per statistic.

Simulated 2PL (theta ~ N(0, 1), b ~ N(0, 1), log a ~ N(0, 0.3^2)) at 161 x 2,000 and
90 x 20,000, clean and with 5% of items' labels flipped (y -> 1 - y). Each is fitted with
the 2PL with ``--signed-discrimination``, ``feas``, the 2PL and the 1PL; for each fit the
table gives, per statistic (``review_score`` = ``p_reversed``, what ``items`` ranks by: the
permutation test that responses fall with ability; ``residual`` = ``Phi(residual_z)``, the
fitted model's residual slope test; ``p_negative_discrimination``; ``p_low_feasibility``),
the share of clean items above the flag threshold (0.95) and the
top-k recall of the flipped items (k = the number flipped).

``--nlu`` adds the real NLU matrix (90 x 82,756): the share flagged per model and the top
20 items' text-free statistics.

Usage: ``python benchmarks/bench_item_review.py [--out benchmarks/results/item_review.json]
[--shapes 161x2000,90x20000 | none] [--models 2pl-signed,feas,2pl,1pl] [--nlu]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from engine.api import fit
from engine.infer.settings import FitSettings
from engine.readout.items import FLAG_THRESHOLD, item_flags, review_order

DATA = Path("/work/shared/data") if Path("/work/shared/data").exists() else \
    Path(__file__).resolve().parents[1].parent / "shared" / "data"
MODELS = (("2pl-signed", "2pl", True), ("feas", "feas", False), ("2pl", "2pl", False), ("1pl", "1pl", False))
FLIP_SHARE = 0.05


def simulate(num_subjects: int, num_items: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Clean 2PL responses and the indices of the 5% of items to flip."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=num_subjects)
    b, a = rng.normal(0, 1, num_items), np.exp(0.3 * rng.normal(size=num_items))
    p = 1 / (1 + np.exp(-a * (theta[:, None] - b)))
    y = (rng.random(p.shape) < p).astype(np.int8)
    flipped = rng.choice(num_items, int(round(FLIP_SHARE * num_items)), replace=False)
    return y, np.sort(flipped)


def statistics(flags: pd.DataFrame) -> dict[str, np.ndarray]:
    """Each statistic on the probability scale (higher = more evidence); set-aside items 0."""
    out = {"review_score": flags["review_score"].to_numpy(),
           "residual": norm.cdf(flags["residual_z"].to_numpy())}
    for c in ("p_negative_discrimination", "p_low_feasibility"):
        if c in flags:
            out[c] = flags[c].to_numpy()
    return {k: np.nan_to_num(v, nan=0.0) for k, v in out.items()}


def evaluate(y: np.ndarray, flipped: np.ndarray, model: str, signed: bool) -> list[dict]:
    """Fit clean and flipped matrices; rows of (statistic, false-flag share, top-k recall)."""
    rows = []
    clean_mask = np.ones(y.shape[1], bool)
    clean_mask[flipped] = False
    for label, data in (("clean", y), ("flipped", _flip(y, flipped))):
        t0 = time.perf_counter()
        res = fit(data, model=model, settings=FitSettings(seed=0), signed_discrimination=signed)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        flags = item_flags(res.spec, res.guide, data)
        flag_s = time.perf_counter() - t0
        for stat, score in statistics(flags).items():
            row = {"data": label, "statistic": stat, "fit_s": round(fit_s, 1), "flags_s": round(flag_s, 2),
                   "passes": res.num_passes, "set_aside": int(flags["set_aside"].sum())}
            if label == "clean":
                row["false_flag_share"] = float((score > FLAG_THRESHOLD).mean())
            else:
                k = len(flipped)
                if stat == "review_score":  # ties of simulated p-values: the items' review order
                    top = review_order(flags)[:k]
                else:
                    top = np.argsort(-score, kind="stable")[:k]
                row["top_k_recall"] = float(np.isin(top, flipped).mean())
                row["false_flag_share_unflipped"] = float((score[clean_mask] > FLAG_THRESHOLD).mean())
                row["flipped_flagged"] = float((score[flipped] > FLAG_THRESHOLD).mean())
            rows.append(row)
    return rows


def _flip(y: np.ndarray, flipped: np.ndarray) -> np.ndarray:
    out = y.copy()
    out[:, flipped] = 1 - out[:, flipped]
    return out


def nlu_review(models=MODELS) -> dict:
    """Share flagged per model on the real NLU matrix, and the top 20 items (no text)."""
    wide = pd.read_parquet(DATA / "nlu" / "responses_items_x_subjects.parquet")
    subjects = [c for c in wide.columns if c not in ("item_id", "item", "dataset")]
    y = wide[subjects].to_numpy().T.astype(np.int8)
    out = {}
    for name, model, signed in models:
        t0 = time.perf_counter()
        res = fit(y, model=model, settings=FitSettings(seed=0), signed_discrimination=signed)
        fit_s = time.perf_counter() - t0
        flags = item_flags(res.spec, res.guide, y)
        means = res.means()
        informative = ~flags["set_aside"].to_numpy()
        top = flags.iloc[review_order(flags)[:20]]
        cols = ["n", "mean_response", "expected_mean", "residual_corr", "residual_z", "reversal_z"] + \
            [c for c in ("p_negative_discrimination", "p_low_feasibility") if c in flags] + ["review_score"]
        table = top[cols].copy()
        table.insert(0, "item_id", wide["item_id"].to_numpy()[top.index])
        table.insert(1, "dataset", wide["dataset"].astype(str).to_numpy()[top.index])
        for block in ("difficulty", "discrimination", "feasibility"):
            if block in means:
                table[block] = np.asarray(means[block])[top.index]
        posterior = {f"share_{c}_above_0.975": float((flags[c][informative] > 0.975).mean())
                     for c in ("p_negative_discrimination", "p_low_feasibility") if c in flags}
        out[name] = {**posterior, "fit_s": round(fit_s, 1), "passes": res.num_passes, "items": int(len(flags)),
                     "set_aside": int((~informative).sum()), "flagged": int(flags["flagged"].sum()),
                     "share_flagged_of_informative": float(flags["flagged"].sum() / informative.sum()),
                     "flagged_by_dataset": flags[flags["flagged"]].groupby(
                         wide["dataset"].astype(str).to_numpy()[flags["flagged"].to_numpy()]).size()
                     .sort_values(ascending=False).head(10).to_dict(),
                     "top20": table.round(4).to_dict(orient="records")}
        print(name, {k: v for k, v in out[name].items() if k != "top20"}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/item_review.json")
    ap.add_argument("--shapes", default="161x2000,90x20000")
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    ap.add_argument("--nlu", action="store_true", help="also the real NLU matrix")
    args = ap.parse_args()
    models = [m for m in MODELS if m[0] in args.models.split(",")]
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "threshold": FLAG_THRESHOLD, "flip_share": FLIP_SHARE, "simulated": []}
    for shape in [v for v in args.shapes.split(",") if v != "none"]:
        s, n = (int(v) for v in shape.split("x"))
        y, flipped = simulate(s, n, seed=s + n)
        for name, model, signed in models:
            for row in evaluate(y, flipped, model, signed):
                row = {"shape": shape, "model": name, **row}
                result["simulated"].append(row)
                print(json.dumps(row), flush=True)
    if args.nlu:
        result["nlu"] = nlu_review(models)
    result["load_average"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
