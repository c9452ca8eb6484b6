"""``bench_coverage.py`` with the quadrature fit's ``sampler_cells_max`` set (issue 16, part 2).

The item sampler's cost bound (``MarginalSettings.sampler_cells_max``, 2e10 cells) decides
at 50 x 1,000 which asymptote-model fits are sampled and which report the Laplace
approximation. This runs ``bench_coverage.py`` (its arguments after the bound) with the
default fit's bound replaced, to measure what a larger one gives:

    python benchmarks/with_sampler_cells_max.py 5e10 --models 3pl --shapes 50x1000 \
        --seeds 1 --first-seed 3 --prior default --out results/x.json
"""

import runpy
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import engine.infer.marginal as marginal  # noqa: E402

try:
    bound = float(sys.argv[1])
except (IndexError, ValueError):
    sys.exit(f"usage: the bound (cells, e.g. 5e10) first, then bench_coverage.py's "
             f"arguments\n{__doc__}")
# the default fit passes no MarginalSettings: fit_marginal_result's default ``settings``
# (its first default, checked here so that a changed signature fails loudly) is replaced
defaults = marginal.fit_marginal_result.__defaults__
if not (defaults and isinstance(defaults[0], marginal.MarginalSettings)):
    sys.exit("fit_marginal_result's first default is no longer its MarginalSettings: "
             "update this script")
marginal.fit_marginal_result.__defaults__ = (
    replace(defaults[0], sampler_cells_max=bound), *defaults[1:])
sys.argv = ["bench_coverage.py"] + sys.argv[2:]
runpy.run_path(str(Path(__file__).resolve().parent / "bench_coverage.py"), run_name="__main__")
