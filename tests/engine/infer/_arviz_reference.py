"""ArviZ's Monte Carlo error of a posterior sd, written out from its definition (ArviZ
0.23's ``mcse(method="sd")``: the delta method on the squared deviations, with their mean's
ESS by ``az.ess``), as the tests' reference. ArviZ's own per-entry loop calls ``float`` on a
one-element array, which numpy 2.5 refuses (TypeError), so where it fails this stands in."""

from __future__ import annotations

import numpy as np


def mcse_sd(az, posterior):
    """``az.mcse(posterior, method="sd")`` on whole arrays of an xarray Dataset."""
    dims = ("chain", "draw")
    squared = (posterior - posterior.mean(dim=dims)) ** 2
    ess = az.ess(squared, method="mean")
    evar = squared.mean(dim=dims)
    varvar = ((squared ** 2).mean(dim=dims) - evar ** 2) / ess
    return np.sqrt(varvar / evar / 4)
