"""mirt for Python's Wald intervals on one data set, run in the bench venv (a subprocess).

    BENCH_PYTHON benchmarks/mirt_wald.py IN.npz OUT.json MODEL [--guessing-beta A,B]

Reads ``responses`` (int, -1 missing) from IN.npz, fits MODEL (1pl, 2pl, 3pl, 4pl or feas) by
EM with Oakes standard errors (maximum likelihood, no item priors), scores EAP abilities with
their posterior sds, and writes discrimination and difficulty (IRT form ``a (theta - b)``),
guessing and feasibility (mirt's ``upper``; both on the probability scale) with standard errors,
and the abilities, as JSON. mirt has no feas family: feas is its 4PL with guessing fixed at 0.
An SE mirt leaves unknown (NaN: mirt holds an estimate on its optimizer box, e.g. guessing at
0 or 0.5, upper at 0.5 or 1, discrimination at 0.1 or 5, fixed and gives it no SE) is written
as null.

``--guessing-beta A,B`` fits Bayes modal (MAP) EM with ``priors={"guessing": BetaPrior(A, B)}``
(mirt's item priors, 3PL and 4PL; mirt's SEs then include the prior's curvature); the output
records it as ``priors``.
"""

import json
import sys
import time

import numpy as np

# our block -> mirt's coef_with_se() column
COLUMNS = {"discrimination": "discrimination", "difficulty": "difficulty",
           "guessing": "guessing", "feasibility": "upper"}


def _floats(values):
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(values, dtype=float)]


def run_in(python, responses, model, timeout=None, guessing_beta=None):
    """This script run on ``responses`` in the bench venv's ``python`` (a subprocess, called
    from the repo's venv): its JSON as a dict, or ``{"failed": why}``."""
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "y.npz", Path(tmp) / "mirt.json"
        np.savez(src, responses=responses)
        extra = ["--guessing-beta", guessing_beta] if guessing_beta else []
        try:
            subprocess.run([python, __file__, str(src), str(dst), model, *extra],
                           check=True, capture_output=True, text=True, timeout=timeout)
        except subprocess.CalledProcessError as err:
            why = err.stderr.strip().splitlines()[-1:] or [f"exit {err.returncode}"]
            return {"failed": why[0]}
        except subprocess.TimeoutExpired:
            return {"failed": f"timed out after {timeout} s"}
        return json.loads(dst.read_text())


def main(argv):
    import mirt

    src, out, model = argv[:3]
    beta = None
    if argv[3:5] and argv[3] == "--guessing-beta":
        beta = tuple(float(v) for v in argv[4].split(","))
    y = np.load(src)["responses"].astype(float)
    y[y < 0] = np.nan
    kwargs = {}
    if model == "feas":  # P = d sigmoid(a (theta - b)): the 4PL with c = 0
        kwargs = {"start_values": {"guessing": np.zeros(y.shape[1])}, "fixed": {"guessing": True}}
    if beta is not None and model in ("3pl", "4pl"):
        from mirt.estimation.priors import BetaPrior

        kwargs["priors"] = {"guessing": BetaPrior(*beta)}
    t0 = time.perf_counter()
    fit = mirt.fit_mirt(y, model="4PL" if model == "feas" else model.upper(), estimation="EM",
                        se_method="oakes", **kwargs)
    table = fit.coef_with_se()
    scores = mirt.fscores(fit, y, method="EAP")
    theta = np.asarray(getattr(scores, "theta", scores)).reshape(len(y), -1)[:, 0]
    se = getattr(scores, "standard_error", None)
    if se is None:
        se = getattr(scores, "se", None)
    result = {
        "tool_version": mirt.__version__, "wall_s": time.perf_counter() - t0,
        "converged": bool(fit.converged), "n_iterations": int(fit.n_iterations),
        "priors": {"guessing": f"Beta({beta[0]:g}, {beta[1]:g})"} if "priors" in kwargs else None,
        "ability": theta.tolist(),
        "ability_se": None if se is None else _floats(np.asarray(se).reshape(len(y), -1)[:, 0]),
    }
    blocks = [b for b in COLUMNS if not (model == "feas" and b == "guessing")]
    for block in blocks:
        if COLUMNS[block] in table:
            result[block] = _floats(table[COLUMNS[block]])
            result[f"{block}_se"] = _floats(table[f"{COLUMNS[block]}_se"])
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
