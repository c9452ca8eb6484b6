"""mirt for Python's Wald intervals on one data set, run in the bench venv (a subprocess).

    BENCH_PYTHON benchmarks/mirt_wald.py IN.npz OUT.json MODEL

Reads ``responses`` (int, -1 missing) from IN.npz, fits mirt's ``1PL`` or ``2PL`` by EM with
Oakes standard errors, scores EAP abilities with their posterior sds, and writes discrimination
and difficulty (IRT form ``a (theta - b)``) with standard errors, and the abilities, as JSON.
"""

import json
import sys
import time

import numpy as np


def main(argv):
    import mirt

    src, out, model = argv
    y = np.load(src)["responses"].astype(float)
    y[y < 0] = np.nan
    t0 = time.perf_counter()
    fit = mirt.fit_mirt(y, model=model.upper(), estimation="EM", se_method="oakes")
    table = fit.coef_with_se()
    scores = mirt.fscores(fit, y, method="EAP")
    theta = np.asarray(getattr(scores, "theta", scores)).reshape(len(y), -1)[:, 0]
    se = getattr(scores, "standard_error", None)
    if se is None:
        se = getattr(scores, "se", None)
    result = {
        "tool_version": mirt.__version__, "wall_s": time.perf_counter() - t0,
        "difficulty": table["difficulty"].tolist(), "difficulty_se": table["difficulty_se"].tolist(),
        "ability": theta.tolist(),
        "ability_se": None if se is None else np.asarray(se).reshape(len(y), -1)[:, 0].tolist(),
    }
    if "discrimination" in table:
        result["discrimination"] = table["discrimination"].tolist()
        result["discrimination_se"] = table["discrimination_se"].tolist()
    with open(out, "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
