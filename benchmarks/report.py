"""Derived numbers (recovery, cells/s), machine info and the markdown table for bench_core."""

from __future__ import annotations

import json
import os
import platform
import subprocess

import numpy as np

__all__ = ["add_derived", "agreement", "json_default", "machine_info", "markdown", "one_line"]

PARAMS = ("ability", "difficulty", "discrimination")
_PACKAGES = ["jax", "jaxlib", "optax", "numpy", "scipy", "pandas", "pyarrow", "mirt", "girth",
             "py-irt", "pyro-ppl", "torch", "psutil", "irt-engine"]


def correlations(est: np.ndarray, ref: np.ndarray) -> dict:
    """Pearson r and Kendall tau-b of two vectors; None where either has a non-finite value."""
    from scipy.stats import kendalltau, pearsonr

    est, ref = np.asarray(est, float), np.asarray(ref, float)
    bad = int(np.count_nonzero(~np.isfinite(est)))
    if bad or est.std() == 0:
        return dict(pearson=None, kendall=None, non_finite=bad)
    return dict(pearson=round(float(pearsonr(est, ref)[0]), 4),
                kendall=round(float(kendalltau(est, ref)[0]), 4))


def _passes(res: dict) -> tuple[int | None, float | None]:
    """(passes over the data, seconds they took) as the tool reports them."""
    for key in ("passes", "iterations", "epochs"):
        if res.get(key):
            return int(res[key]), res.get("fit_s", res.get("wall_s"))
    return None, None


def add_derived(res: dict, observed: int, truth: dict | None) -> None:
    """Add cells/s per pass and, for simulated data, recovery vs the truth (in place)."""
    if res.get("status") != "ok":
        return
    passes, seconds = _passes(res)
    if passes and seconds and "cells_per_s_per_pass" not in res:
        res["cells_per_s_per_pass"] = observed * passes / seconds
    est = res.get("estimates", {})
    if truth is not None:
        res["recovery"] = {k: correlations(est[k], truth[k]) for k in PARAMS if k in est}


def agreement(fits: list[dict]) -> dict:
    """Correlation of irt-engine's and mirt's estimates, per model (real data, no truth)."""
    out = {}
    for model in sorted({f["model"] for f in fits}):
        by_tool = {f["tool"]: f for f in fits if f["model"] == model and f["status"] == "ok"}
        if "irt-engine" not in by_tool or "mirt" not in by_tool:
            out[model] = dict(reason=f"needs ok fits of irt-engine and mirt, got {sorted(by_tool)}")
            continue
        eng, ref = by_tool["irt-engine"]["estimates"], by_tool["mirt"]["estimates"]
        out[model] = {k: correlations(eng[k], ref[k]) for k in PARAMS if k in eng and k in ref}
    return out


def _venv_versions(python: str) -> dict:
    """Python and package versions inside another interpreter (empty dict if it fails)."""
    code = ("import json,sys,importlib.metadata as m\nout={'python':sys.version.split()[0]}\n"
            f"for p in {_PACKAGES!r}:\n try: out[p]=m.version(p)\n except Exception: pass\n"
            "print(json.dumps(out))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


def machine_info(bench_python: str, engine_python: str) -> dict:
    """CPU model, cores, memory and both virtualenvs' versions."""
    cpu, mem_gb = platform.processor(), None
    with open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    with open("/proc/meminfo") as fh:
        mem_gb = next(int(ln.split()[1]) * 1024 / 1e9 for ln in fh if ln.startswith("MemTotal"))
    return dict(cpu=cpu, cores=os.cpu_count(), cores_usable=len(os.sched_getaffinity(0)),
                mem_gb=round(mem_gb, 1), kernel=platform.release(),
                bench_venv=dict(path=bench_python, **_venv_versions(bench_python)),
                engine_venv=dict(path=engine_python, **_venv_versions(engine_python)))


def json_default(obj):
    """JSON encoder for numpy scalars/arrays."""
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def _fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _rec(res: dict, stat: str) -> str:
    rec = res.get("recovery") or {}

    def cell(k: str) -> str:
        if k not in rec:
            return "-"
        return "NaN" if rec[k].get("non_finite") else _fmt(rec[k].get(stat), ".3f")

    return " / ".join(cell(k) for k in PARAMS)


def _reason(res: dict, width: int) -> str:
    lines = str(res.get("reason") or "").strip().splitlines()
    return lines[-1][:width] if lines else ""


def one_line(res: dict) -> str:
    """Short progress line for one fit."""
    if res.get("status") != "ok":
        return f"{res.get('status')}: {_reason(res, 300)}"
    passes, _ = _passes(res)
    return (f"{res['wall_s']:.2f} s, {_fmt(res.get('peak_rss_gb'))} GB, passes {passes}, "
            f"converged {res.get('converged')}, r {_rec(res, 'pearson')}")


def _fit_row(name: str, res: dict) -> str:
    passes, _ = _passes(res)
    if res.get("status") != "ok":
        reason = _reason(res, 80)
        rss = _fmt(res.get("peak_rss_gb"), ".2f")
        return (f"| {name} | {res['model']} | {res['tool']} | {res['status']}: {reason} | - | "
                f"{rss} | - | - | - | - | - | - | - |")
    return (f"| {name} | {res['model']} | {res['tool']} | ok | {res['wall_s']:.2f} | "
            f"{_fmt(res.get('peak_rss_gb'), '.2f')} | {_fmt(passes, 'd')} | "
            f"{res.get('converged', '-')} | {_fmt(res.get('cells_per_s_per_pass'), '.2e')} | "
            f"{_fmt(res.get('compile_time_s'), '.2f')} | "
            f"{_fmt(res.get('cells_per_s_median_pass'), '.2e')} | "
            f"{_rec(res, 'pearson')} | {_rec(res, 'kendall')} |")


def speedups(results: dict) -> list[str]:
    """Lines: irt-engine's wall time against the fastest ok incumbent, per data set and model."""
    lines = ["\n| data | model | irt-engine run, s | fastest incumbent | its s | ratio |",
             "|---|---|---|---|---|---|"]
    for name, entry in results["datasets"].items():
        for model in sorted({f["model"] for f in entry["fits"]}):
            ok = [f for f in entry["fits"] if f["model"] == model and f["status"] == "ok"]
            eng = [f for f in ok if f["tool"].startswith("irt-engine")]
            inc = sorted((f for f in ok if not f["tool"].startswith("irt-engine")),
                         key=lambda f: f["wall_s"])
            for run in eng if inc else []:
                e, i = run["wall_s"], inc[0]["wall_s"]
                lines.append(f"| {name} | {model} | {run['tool']} {e:.2f} | {inc[0]['tool']} | "
                             f"{i:.2f} | {i / e:.1f}x |")
    return lines if len(lines) > 2 else []


def markdown(results: dict) -> str:
    """Markdown tables of every fit, the NLU agreement and the JAX probe."""
    m = results["machine"]
    lines = [f"# Core benchmark\n\nMachine: {m['cpu']}, {m['cores']} cores, {m['mem_gb']} GB.\n",
             "wall s = fit only (mirt, girth: fit + EAP abilities; irt-engine: JAX compilation "
             "included, most of it in the 1st pass); RSS = child's peak; cells/s/pass (wall) = "
             "cells x passes / wall; median pass = the trace's passes after the first; "
             "recovery = ability / difficulty / discrimination vs truth.\n",
             "| data | model | tool | status | wall s | peak RSS GB | passes | converged | "
             "cells/s/pass (wall) | 1st pass s | cells/s, median pass | Pearson r | Kendall tau |",
             "|" + "---|" * 13]
    for name, entry in results["datasets"].items():
        lines += [_fit_row(name, f) for f in entry["fits"]]
    for name, entry in results["datasets"].items():
        for model, agree in entry.get("agreement", {}).items():
            txt = json.dumps(agree)
            lines.append(f"\n{name} {model}: irt-engine vs mirt agreement: {txt}")
        for fit in entry["fits"]:
            if fit.get("log_likelihood") is not None:
                lines.append(f"\n{name} {fit['model']} {fit['tool']} log-likelihood "
                             f"(as the tool reports it; mirt: marginal): "
                             f"{fit['log_likelihood']:.2f}")
    probe = ["\n| data | cells | JAX probe cores | cells/s | irt-engine median pass / probe |",
             "|---|---|---|---|---|"]
    for name, entry in results["datasets"].items():
        for p in entry.get("jax_probe", []):
            ratios = [f"{f['model']} {f['cells_per_s_median_pass'] / p['cells_per_s']:.0%}"
                      for f in entry["fits"] if f.get("tool") == "irt-engine"
                      and f.get("cells_per_s_median_pass") and p.get("cells_per_s")]
            probe.append(f"| {name} | {entry['observed_cells']} | {p.get('cores') or 'all'} | "
                         f"{_fmt(p.get('cells_per_s'), '.2e')} | {', '.join(ratios) or '-'} |")
    notes = [f"\n{name} {f['model']} {f['tool']}: EAP ability non-finite for "
             f"{f['ability_nan_fraction']:.0%} of subjects"
             for name, entry in results["datasets"].items() for f in entry["fits"]
             if f.get("ability_nan_fraction")]
    return "\n".join(lines + notes + speedups(results) + (probe if len(probe) > 2 else [])) + "\n"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results/core.json")
    src.with_suffix(".md").write_text(markdown(json.loads(src.read_text())))
    print(f"wrote {src.with_suffix('.md')}")
