"""The incumbent IRT tools, each fitted in a child process of the benchmark virtualenv.

Parent side: ``run_incumbent(name, responses, timeout=600)`` -> result dict (see
``subproc.run_worker``).  Child side: ``python incumbents.py NAME DATA.npy OUT_DIR OPTIONS``.

Every tool's estimates are converted to one convention: P(y = 1) = sigmoid(a * (theta - b)),
returned as ``ability`` (theta), ``difficulty`` (b) and ``discrimination`` (a).
  * mirt for Python 1.2.0 stores (discrimination a, difficulty b) in that IRT form already
    (``models/dichotomous.py``: logits = a * (theta - b)); its native 2PL EM returns the same.
    A slope-intercept intercept d would be b = -d / a; we never see d here.
  * girth 0.8.0 ``rasch_mml`` returns b in the same form (expit(a * (theta - b))).
  * py-irt 0.7.1 "2pl": logits = a * (theta - b); export gives "diff" = b and "disc" =
    exp(loc_slope) = a (the LogNormal guide's location, exponentiated).  No sign flip.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["BENCH_PYTHON", "INCUMBENTS", "run_incumbent"]

BENCH_PYTHON = os.environ.get("IRT_BENCH_PYTHON", "/work/bench-venv/bin/python")
_HERE = Path(__file__).resolve()


# ---------------------------------------------------------------- child side: one fn per tool


def fit_mirt(responses: np.ndarray, model: str = "2PL", **opts) -> tuple[dict, dict]:
    """mirt for Python: marginal ML by EM (21 quadrature points), standard errors off, + EAP."""
    import mirt

    start = time.perf_counter()
    fit = mirt.fit_mirt(responses, model=model, estimation="EM",
                        compute_standard_errors=False, **opts)
    fit_s = time.perf_counter() - start
    scores = mirt.fscores(fit, responses, method="EAP")
    wall_s = time.perf_counter() - start
    params = fit.model.parameters
    meta = dict(tool="mirt", tool_version=mirt.__version__, model=model.lower(),
                estimator="EM, 21 quad pts, no SEs; EAP abilities",
                wall_s=wall_s, fit_s=fit_s, score_s=wall_s - fit_s,
                iterations=int(fit.n_iterations), converged=bool(fit.converged),
                log_likelihood=float(fit.log_likelihood))
    arrays = dict(ability=np.ravel(scores.theta), difficulty=params["difficulty"])
    if model != "1PL":  # mirt's 1PL fixes a = 1
        arrays["discrimination"] = np.ravel(params["discrimination"])
    return meta, arrays


def fit_girth_rasch(responses: np.ndarray, **opts) -> tuple[dict, dict]:
    """girth rasch_mml (a = 1) + ability_eap; girth wants items x subjects, -99999 = missing."""
    import girth
    from importlib.metadata import version

    data = responses.T.astype(np.int32)
    data[data < 0] = girth.INVALID_RESPONSE if hasattr(girth, "INVALID_RESPONSE") else -99999
    start = time.perf_counter()
    est = girth.rasch_mml(data, **opts)
    fit_s = time.perf_counter() - start
    with np.errstate(all="ignore"):
        ability = girth.ability_eap(data, est["Difficulty"], est["Discrimination"])
    wall_s = time.perf_counter() - start
    meta = dict(tool="girth", tool_version=version("girth"), model="1pl",
                estimator="rasch_mml (MML, a = 1) + ability_eap",
                wall_s=wall_s, fit_s=fit_s, score_s=wall_s - fit_s,
                ability_nan_fraction=float(np.mean(~np.isfinite(ability))))
    return meta, dict(ability=ability, difficulty=est["Difficulty"])


def _pyirt_dataset(responses: np.ndarray):
    """Build a py-irt Dataset straight from the matrix (row-major observed cells)."""
    from py_irt.dataset import Dataset

    subj, item = np.nonzero(responses >= 0)
    num_subjects, num_items = responses.shape
    return Dataset(
        item_ids=set(map(str, range(num_items))),
        subject_ids=set(map(str, range(num_subjects))),
        item_id_to_ix={str(i): i for i in range(num_items)},
        ix_to_item_id={i: str(i) for i in range(num_items)},
        subject_id_to_ix={str(s): s for s in range(num_subjects)},
        ix_to_subject_id={s: str(s) for s in range(num_subjects)},
        observation_subjects=subj.tolist(),
        observation_items=item.tolist(),
        observations=responses[subj, item].astype(float).tolist(),
        training_example=[True] * subj.size,
    )


def fit_pyirt_2pl(responses: np.ndarray, epochs: int = 2000, seed: int = 0) -> tuple[dict, dict]:
    """py-irt 2PL, Pyro SVI with its defaults (vague priors, Adam lr 0.1, 2,000 epochs)."""
    import pyro
    from importlib.metadata import version
    from py_irt.config import IrtConfig
    from py_irt.training import IrtModelTrainer

    pyro.set_rng_seed(seed)
    dataset = _pyirt_dataset(responses)
    trainer = IrtModelTrainer(data_path=None, config=IrtConfig(model_type="2pl", epochs=epochs),
                              dataset=dataset, verbose=False)
    start = time.perf_counter()
    trainer.train(device="cpu")
    wall_s = time.perf_counter() - start
    params = trainer.last_params  # what the py-irt CLI saves
    order = lambda ids: np.array([int(ids[i]) for i in range(len(ids))])  # noqa: E731
    subj_order, item_order = order(params["subject_ids"]), order(params["item_ids"])
    ability = np.empty(responses.shape[0]); ability[subj_order] = params["ability"]
    diff = np.empty(responses.shape[1]); diff[item_order] = params["diff"]
    disc = np.empty(responses.shape[1]); disc[item_order] = params["disc"]
    meta = dict(tool="py-irt", tool_version=version("py-irt"), model="2pl",
                estimator=f"Pyro SVI, vague priors, {epochs} epochs (defaults)",
                wall_s=wall_s, epochs=epochs, converged=None)
    return meta, dict(ability=ability, difficulty=diff, discrimination=disc)


def fit_mirt_factors(responses: np.ndarray, factors: int = 2, **opts) -> tuple[dict, dict]:
    """mirt for Python's exploratory multidimensional 2PL (the port of R's ``mirt(data, F)``):
    EM over a ``21^F`` quadrature grid, no SEs, then EAP abilities; progress printed per EM
    iteration so that a killed run shows how far it got.

    Its item model is ``P(y = 1) = sigmoid(a . theta - d)``-style with unrotated loadings
    ``discrimination`` (items x F); abilities are ``ability`` (subjects x F).
    """
    import mirt

    start = time.perf_counter()
    fit = mirt.fit_mirt(responses, model="2PL", n_factors=factors, estimation="EM",
                        compute_standard_errors=False, verbose=True, **opts)
    fit_s = time.perf_counter() - start
    scores = mirt.fscores(fit, responses, method="EAP")
    wall_s = time.perf_counter() - start
    params = fit.model.parameters
    meta = dict(tool="mirt", tool_version=mirt.__version__, model=f"2pl-{factors}f",
                estimator=f"EM, 21^{factors} quad pts, no SEs; EAP abilities",
                wall_s=wall_s, fit_s=fit_s, score_s=wall_s - fit_s,
                iterations=int(fit.n_iterations), converged=bool(fit.converged),
                log_likelihood=float(fit.log_likelihood))
    return meta, dict(ability=np.asarray(scores.theta).reshape(responses.shape[0], -1),
                      difficulty=np.asarray(params["difficulty"]),
                      discrimination=np.asarray(params["discrimination"]))


def fit_pyirt_multidim(responses: np.ndarray, dims: int = 2, epochs: int = 2000,
                       seed: int = 0) -> tuple[dict, dict]:
    """py-irt ``multidim_2pl``: logits = sum_d gamma_nd (theta_sd - b_nd), hierarchical priors,
    Pyro SVI with its defaults (Adam lr 0.1); export gives per-dimension ability, diff and
    disc = exp(loc_disc)."""
    import pyro
    from importlib.metadata import version
    from py_irt.config import IrtConfig
    from py_irt.training import IrtModelTrainer

    pyro.set_rng_seed(seed)
    dataset = _pyirt_dataset(responses)
    config = IrtConfig(model_type="multidim_2pl", epochs=epochs, dims=dims)
    trainer = IrtModelTrainer(data_path=None, config=config, dataset=dataset, verbose=False)
    start = time.perf_counter()
    trainer.train(device="cpu")
    wall_s = time.perf_counter() - start
    params = trainer.last_params
    order = lambda ids: np.array([int(ids[i]) for i in range(len(ids))])  # noqa: E731
    subj_order, item_order = order(params["subject_ids"]), order(params["item_ids"])
    ability = np.empty((responses.shape[0], dims)); ability[subj_order] = params["ability"]
    diff = np.empty((responses.shape[1], dims)); diff[item_order] = params["diff"]
    disc = np.empty((responses.shape[1], dims)); disc[item_order] = params["disc"]
    meta = dict(tool="py-irt", tool_version=version("py-irt"), model=f"multidim_2pl-{dims}d",
                estimator=f"Pyro SVI, hierarchical priors, {epochs} epochs",
                wall_s=wall_s, epochs=epochs, converged=None)
    return meta, dict(ability=ability, difficulty=diff, discrimination=disc)


INCUMBENTS = {
    "mirt_2pl": lambda y, **o: fit_mirt(y, model="2PL", **o),
    "mirt_1pl": lambda y, **o: fit_mirt(y, model="1PL", **o),
    "girth_1pl": fit_girth_rasch,
    "pyirt_2pl": fit_pyirt_2pl,
    "mirt_2pl_factors": fit_mirt_factors,
    "pyirt_multidim": fit_pyirt_multidim,
}


def _worker_main(argv: list[str]) -> None:
    """Child entry point: NAME DATA.npy OUT_DIR OPTIONS_JSON."""
    sys.path.insert(0, str(_HERE.parent))
    from subproc import write_worker_result

    name, data_file, out_dir, options = argv
    responses = np.load(data_file)
    meta, arrays = INCUMBENTS[name](responses, **json.loads(options))
    write_worker_result(out_dir, dict(meta, python=sys.version.split()[0]), arrays)


# ---------------------------------------------------------------- parent side


def run_incumbent(name: str, responses: np.ndarray, *, timeout: float = 600.0,
                  python: str = BENCH_PYTHON, options: dict | None = None,
                  env: dict | None = None) -> dict:
    """Fit incumbent ``name`` (a key of INCUMBENTS) in a child process; never raises."""
    from subproc import run_worker

    if not Path(python).exists():
        return dict(job=name, status="failed", reason=f"no interpreter at {python}")
    return run_worker(python, _HERE, name, responses, timeout=timeout, options=options, env=env)


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
