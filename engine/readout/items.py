"""Item read-outs: response probabilities, Fisher information, annotation-error flags,
the difficulty x discrimination quartile table (seed 002 5.1-5.2, figure 6) and the
per-item selection rules of adaptive testing (seed 002 4.4).

Nothing here branches on a model's name: probabilities come from ``spec.loglik``,
information from its derivative in the ability, and each flag is computed when the run
has the parameter block it reads (a real-line ``discrimination``, a ``feasibility``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from scipy.stats import norm

from engine.data.store import open_store
from engine.errors import DataFormatError, ModelError, SettingsError, StoreNotFoundError
from engine.host import to_device
from engine.infer.guide import GuideState, constrained_means
from engine.models.spec import ModelSpec

__all__ = ["ItemBank", "item_bank", "load_run_responses", "item_flags", "disagreeing_subjects",
           "quartile_table", "STRATEGIES", "strategy_scores", "next_item",
           "review_items", "review_order", "choose_subjects", "expected_probabilities",
           "response_probabilities", "FLAG_LEVEL", "FLAG_THRESHOLD", "SET_ASIDE_NOTE",
           "item_readouts_unavailable"]

FLAG_LEVEL = 0.05  # the share of items the model fits that are flagged, at most
FLAG_THRESHOLD = 1.0 - FLAG_LEVEL  # review_score above which an item is flagged
SIMULATED_BELOW = 100  # items with fewer responses get a simulated null for residual_z
SET_ASIDE_NOTE = "no information: every subject answered alike"
STRATEGIES = ("fisher", "discrimination", "disc_diff", "difficulty", "random")
_CELLS = 1 << 23  # cells per chunk when a read-out walks the whole matrix


@dataclass(frozen=True)
class ItemBank:
    """Point estimates (constrained posterior locations) of every item and global block
    of a fitted model, with the model's response probability as a function of ability.
    """

    spec: ModelSpec
    params: dict  # name -> np.ndarray (N,) for item blocks, scalar for globals
    num_items: int

    def subset(self, idx: np.ndarray) -> "ItemBank":
        """The bank restricted to items ``idx`` (globals kept)."""
        owner = {p.name: p.owner for p in self.spec.params}
        sub = {k: (v[idx] if owner[k] == "item" else v) for k, v in self.params.items()}
        return ItemBank(self.spec, sub, int(np.size(idx)))

    def prob(self, ability) -> np.ndarray:
        """``P(y = 1 | ability)`` for each ability and item, ``(g, n)``."""
        return np.asarray(response_probabilities(self.spec, self.num_items, self._on_device(),
                                                 {"ability": to_device(ability, np.float32)}))

    def _on_device(self) -> dict:
        return {k: to_device(v) for k, v in self.params.items()}

    def information(self, ability) -> np.ndarray:
        """Fisher information ``P'(theta)^2 / (P (1 - P))`` of each item at each ability, ``(g, n)``.

        ``P'`` is the exact derivative of the model's probability (forward mode), so the
        formula holds for any binary model: ``a^2 P (1 - P)`` for the 2PL (seed 002 eq. 2).
        """
        return np.asarray(_information(self.spec, self.num_items, self._on_device(),
                                       to_device(ability, np.float32)))


@partial(jax.jit, static_argnums=(0, 1))
def response_probabilities(spec: ModelSpec, num_items: int, params: dict, subject: dict):
    """``P(y = 1)`` of every item for each row of the subject blocks ``subject`` (name ->
    ``(g, ...)``), the item blocks (``(n, ...)``) and globals at ``params``: ``(g, n)``,
    from the model's own log-likelihood. One program a shape (run eagerly, its two dozen
    operations compiled one program each, 1.9 s of a report's first 6.7 s)."""
    expanded = {}
    for p in spec.likelihood_params:
        if p.owner == "subject":
            expanded[p.name] = subject[p.name][:, None]
        elif p.owner == "item":
            expanded[p.name] = params[p.name][None, :]
        else:
            expanded[p.name] = params[p.name]
    rows = next(iter(subject.values())).shape[0]
    ones = jnp.ones((rows, num_items), jnp.float32)
    return jnp.exp(spec.loglik(expanded, ones, ones))


@partial(jax.jit, static_argnums=(0, 1))
def _information(spec: ModelSpec, num_items: int, params: dict, ability):
    """:meth:`ItemBank.information` as one program (its clip and quotient run eagerly were
    seven more programs a shape)."""
    def prob(theta):
        return response_probabilities(spec, num_items, params, {"ability": theta})

    p, dp = jax.jvp(prob, (ability,), (jnp.ones_like(ability),))
    p = jnp.clip(p, 1e-7, 1 - 1e-7)
    return dp ** 2 / (p * (1 - p))


def item_readouts_unavailable(spec: ModelSpec) -> str | None:
    """Why the item read-outs (information, selection, curves, review flags) do not apply
    to ``spec``, or None where they do: they need one scalar ``ability`` block and binary
    responses."""
    if spec.kind != "binary":  # the first reason a user can act on: fit a binary model
        return f"model {spec.name!r} has {spec.kind!r} responses; item read-outs need binary responses"
    subject = [p for p in spec.likelihood_params if p.owner == "subject"]
    if [p.name for p in subject] != ["ability"] or subject[0].shape != ():
        return (f"model {spec.name!r} has subject blocks {[p.name for p in subject]} "
                f"with shapes {[p.shape for p in subject]}; item information and "
                f"selection need one scalar 'ability' block")
    return None


def _check_scalar_ability(spec: ModelSpec) -> None:
    reason = item_readouts_unavailable(spec)
    if reason is not None:
        raise ModelError(reason)


def item_bank(spec: ModelSpec, guide: GuideState) -> ItemBank:
    """The item bank of a fitted guide: constrained locations of item and global blocks."""
    _check_scalar_ability(spec)
    means = constrained_means(spec, guide)
    params = {p.name: np.asarray(means[p.name], np.float32) for p in spec.params if p.owner != "subject"}
    num_items = next(int(np.shape(guide.loc[p.name])[0]) for p in spec.params if p.owner == "item")
    return ItemBank(spec, params, num_items)


def _open_recorded_store(run):
    """The store fit.json records, tried beside the run first (see ``store_candidates``)."""
    from engine.run import store_candidates

    tried = store_candidates(run)
    if not tried:
        raise StoreNotFoundError(f"{run.path / 'fit.json'} records no response store (the fit was "
                                 f"on an in-memory array); pass the store with --store "
                                 f"(store= in the library)")
    for path in tried:
        if path.exists():
            return open_store(path)
    raise StoreNotFoundError(f"the response store of run {run.path} was not found; tried "
                             f"{', '.join(str(p) for p in tried)}: pass the store with "
                             f"--store (store= in the library)")


def load_run_responses(run, store: str | Path | None = None) -> np.ndarray:
    """The run's response matrix, rows and columns in the run's subject and item order.

    Reads ``store`` or else the store recorded in ``fit.json``; the ids must match the
    run's and, when the run recorded a checksum, so must the store's.
    """
    if store is not None:
        try:
            st = open_store(store)
        except StoreNotFoundError as err:
            raise StoreNotFoundError(f"{err} (the path given with --store, or store=); pass the "
                                     f"store the run {run.path} was fitted on") from err
    else:
        st = _open_recorded_store(run)
    subjects = np.asarray([str(s) for s in st.subjects.tolist()], dtype=object)
    items = np.asarray([str(s) for s in st.items.tolist()], dtype=object)
    want_s = run.subjects["subject"].astype(str).to_numpy()
    want_i = run.items["item"].astype(str).to_numpy()
    if len(subjects) != len(want_s) or len(items) != len(want_i) or \
            not (subjects == want_s).all() or not (items == want_i).all():
        raise DataFormatError(f"store {st.path} has {len(subjects)} subjects x {len(items)} items "
                              f"that differ from run {run.path} ({len(want_s)} x {len(want_i)}, "
                              f"ids in run order); pass the store the run was fitted on")
    checksum = run.info.get("data", {}).get("checksum")
    if checksum and st.meta.get("checksum") != checksum:
        raise DataFormatError(f"store {st.path} checksum {st.meta.get('checksum')} differs from "
                              f"the run's {checksum} ({run.path / 'fit.json'}); the store changed "
                              f"since the fit: refit or pass the original store")
    return st.load()


def _chunks(num_subjects: int, num_items: int):
    width = max(1, _CELLS // max(num_subjects, 1))
    for start in range(0, num_items, width):
        yield slice(start, min(num_items, start + width))


def _prob_matrix(bank: ItemBank, ability: np.ndarray, cols: slice) -> np.ndarray:
    return bank.subset(np.arange(cols.start, cols.stop)).prob(ability)


def _tail_below_zero(spec: ModelSpec, guide: GuideState, name: str, threshold: float) -> np.ndarray | None:
    """Posterior ``P(block < threshold)`` under the Gaussian guide, mapped through the
    block's monotone transform; ``None`` when the run has no such block."""
    if name not in spec.names:
        return None
    p = spec.param(name)
    inverse = {"identity": lambda c: c, "exp": np.log, "sigmoid": lambda c: np.log(c / (1 - c))}
    with np.errstate(divide="ignore"):
        cut = inverse[p.transform](threshold)
    loc, scale = np.asarray(guide.loc[name], np.float64), np.exp(np.asarray(guide.log_scale[name], np.float64))
    return norm.cdf((cut - loc) / scale)


def item_flags(spec: ModelSpec, guide: GuideState, y: np.ndarray, *,
               feasibility_cut: float = 0.5, seed: int = 0, num_draws: int = 2000) -> pd.DataFrame:
    """Evidence of an annotation error for every item, one row per item (run order).

    Columns: ``n``, ``mean_response``, ``expected_mean``; ``set_aside`` (every observed
    response alike, or none observed: the fit treats the item as unobserved, so it carries
    no evidence and gets no statistics or score); ``outfit`` (mean squared standardised
    residual) and ``outfit_z`` (its Wilson-Hilferty z); ``residual_corr`` (correlation of
    the residual ``y - P`` with ability; a mislabelled item's residuals fall with ability);
    ``residual_z``, the score test of a slope in ability on the item's residuals,
    ``-sum (theta - theta_w) (y - P) / sqrt(sum (theta - theta_w)^2 P (1 - P))`` with
    ``theta_w`` the ``P (1 - P)``-weighted mean ability: about N(0, 1) for an item the model
    fits, large when the item discriminates less than the model says (misfit, not an error
    flag: under the 1PL every weakly discriminating item is large); ``reversal_z``, the
    statistic of the permutation test that the item's responses fall with ability,
    ``-sum (theta - mean) y`` over its observed subjects over its permutation sd (the score
    test of a zero against a negative discrimination); ``p_reversed``, one minus that test's
    p-value: the normal tail, or for items with fewer than ``SIMULATED_BELOW`` responses the
    exact permutation p-value estimated from ``num_draws`` shuffles seeded by ``seed``;
    ``p_negative_discrimination`` when the run has a discrimination block that can be
    negative; ``p_low_feasibility`` (``P(feasibility < feasibility_cut)``) when it has a
    feasibility block.

    ``review_score`` is ``p_reversed``. Its null is an item unrelated to ability, so an item
    that works (any positive discrimination) scores above ``FLAG_THRESHOLD`` less than
    ``FLAG_LEVEL`` of the time whatever model was fitted; ``flagged`` marks those items. The
    posterior probabilities are shown beside it, not in it: on the real NLU matrix the
    Gaussian posterior's ``P(a < 0)`` is above 0.975 on 4,477 items the permutation test does
    not flag, 586 of them with one or two minority responses (a ridge in ``(a, b)`` the
    Gaussian cannot hold); ``benchmarks/bench_item_review.py`` measures every statistic.
    """
    bank = item_bank(spec, guide)
    ability = np.asarray(constrained_means(spec, guide)["ability"], np.float64)
    S, N = y.shape
    if bank.num_items != N:
        raise DataFormatError(f"responses have {N} items, the fit has {bank.num_items}")
    names = ("n", "num_correct", "mean_response", "expected_mean", "outfit", "residual_corr", "score",
             "score_var", "theta_y", "theta_ss")
    cols = {k: np.empty(N) for k in names}
    centred = ability - ability.mean()
    for sl in _chunks(S, N):
        p = _prob_matrix(bank, ability.astype(np.float32), sl).astype(np.float64)
        yy = y[:, sl]
        m = yy >= 0
        n = m.sum(axis=0)
        yv = np.where(m, yy, 0).astype(np.float64)
        r = np.where(m, yv - p, 0.0)
        var = np.where(m, np.clip(p * (1 - p), 1e-9, None), 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["n"][sl] = n
            cols["num_correct"][sl] = yv.sum(0)
            cols["mean_response"][sl] = yv.sum(0) / n
            cols["expected_mean"][sl] = np.where(m, p, 0).sum(0) / n
            cols["outfit"][sl] = (r ** 2 / np.where(m, var, 1.0)).sum(0) / n
            # correlation of residual and ability over each item's observed subjects
            th = np.where(m, centred[:, None], 0.0)
            th_mean = th.sum(0) / n
            r_mean = r.sum(0) / n
            cov = (th * r).sum(0) / n - th_mean * r_mean
            sd_t = np.sqrt(np.clip((th ** 2).sum(0) / n - th_mean ** 2, 0, None))
            sd_r = np.sqrt(np.clip((r ** 2).sum(0) / n - r_mean ** 2, 0, None))
            cols["residual_corr"][sl] = cov / (sd_t * sd_r)
            # score test of a slope in ability, the intercept refitted (weighted centring)
            th_w = (var * centred[:, None]).sum(0) / var.sum(0)
            dev = np.where(m, centred[:, None] - th_w, 0.0)
            cols["score"][sl] = (dev * r).sum(0)
            cols["score_var"][sl] = (dev ** 2 * var).sum(0)
            # the reversal statistic: sum over observed subjects of (theta - mean) y
            tc = np.where(m, centred[:, None] - th_mean, 0.0)
            cols["theta_y"][sl] = (tc * yv).sum(0)
            cols["theta_ss"][sl] = (tc ** 2).sum(0)
    df = pd.DataFrame({k: cols[k] for k in ("n", "mean_response", "expected_mean", "outfit",
                                            "residual_corr")})
    df["n"] = df["n"].astype(np.int64)
    aside = (cols["n"] == 0) | (cols["num_correct"] == 0) | (cols["num_correct"] == cols["n"])
    df.insert(1, "set_aside", aside)
    n = np.maximum(df["n"].to_numpy(), 4)
    # Wilson-Hilferty: outfit * n is roughly chi-square on n degrees of freedom.
    q = np.sqrt(2.0 / (9.0 * n))
    df["outfit_z"] = (np.cbrt(df["outfit"]) - (1 - q ** 2)) / q
    with np.errstate(invalid="ignore", divide="ignore"):
        df["residual_z"] = -cols["score"] / np.sqrt(cols["score_var"])
    with np.errstate(invalid="ignore", divide="ignore"):  # permutation mean and variance of T
        k, n_obs = cols["num_correct"], cols["n"]
        var_t = k * (n_obs - k) / (n_obs * (n_obs - 1)) * cols["theta_ss"]
        df["reversal_z"] = -cols["theta_y"] / np.sqrt(var_t)
    p_rev = norm.sf(df["reversal_z"].to_numpy())
    # Few responses: the exact permutation p-value, by simulation, where it can matter (the
    # responses do not rise with ability); elsewhere the normal tail is above 1/2 anyway.
    small = np.flatnonzero(~aside & (cols["n"] < SIMULATED_BELOW) & ~(p_rev > 0.5))
    if len(small):
        p_rev[small] = _permutation_p_values(ability, y, small, np.random.default_rng(seed), num_draws)
    df["p_reversed"] = 1.0 - p_rev
    p_neg = _tail_below_zero(spec, guide, "discrimination", 0.0)
    if p_neg is not None and spec.param("discrimination").transform == "identity":
        df["p_negative_discrimination"] = p_neg
    p_feas = _tail_below_zero(spec, guide, "feasibility", feasibility_cut)
    if p_feas is not None:
        df["p_low_feasibility"] = p_feas
    df["review_score"] = df["p_reversed"]
    stats = ["outfit", "residual_corr", "outfit_z", "residual_z", "reversal_z", "p_reversed",
             "p_negative_discrimination",
             "p_low_feasibility", "review_score"]
    df.loc[aside, [c for c in stats if c in df]] = np.nan
    df["flagged"] = df["review_score"].fillna(0.0).to_numpy() > FLAG_THRESHOLD
    return df


def _permutation_p_values(ability: np.ndarray, y: np.ndarray, items: np.ndarray,
                          rng: np.random.Generator, num_draws: int) -> np.ndarray:
    """One-sided p-values ``(1 + #{T* <= T}) / (B + 1)`` of ``T = sum (theta - mean) y``
    over each item's observed subjects, ``T*`` with the item's responses shuffled among
    them (the null: the item is unrelated to ability); for items with few responses."""
    cols = y[:, items]
    m = cols >= 0
    width = int(m.sum(0).max())
    theta = np.full((len(items), width), np.nan)
    resp = np.zeros((len(items), width))
    for j in range(len(items)):
        obs = np.flatnonzero(m[:, j])
        theta[j, :len(obs)] = ability[obs] - ability[obs].mean()
        resp[j, :len(obs)] = cols[obs, j]
    observed = (np.nan_to_num(theta) * resp).sum(1)
    k = resp.sum(1)
    out = np.empty(len(items))
    step = max(1, (1 << 23) // (num_draws * width))
    for start in range(0, len(items), step):
        th = theta[start:start + step]
        keys = rng.random((num_draws,) + th.shape, dtype=np.float32)
        keys[:, np.isnan(th)] = np.inf  # missing cells are never drawn
        # the first k of a random order of the observed subjects: sum their abilities
        shuffled = np.take_along_axis(np.broadcast_to(np.nan_to_num(th), keys.shape),
                                      np.argsort(keys, axis=-1), axis=-1)
        cums = np.concatenate([np.zeros(shuffled.shape[:-1] + (1,)), np.cumsum(shuffled, axis=-1)], -1)
        kk = np.broadcast_to(k[start:start + step, None].astype(np.int64), cums.shape[:-1] + (1,))
        t_sim = np.take_along_axis(cums, kk, axis=-1)[..., 0]
        obs = observed[start:start + step]
        below = (t_sim <= obs + 1e-6 * (1 + np.abs(obs))).sum(0)  # ties count (float32 abilities)
        out[start:start + step] = (1 + below) / (num_draws + 1)
    return out


def review_order(flags: pd.DataFrame) -> np.ndarray:
    """Row indices of the informative items, highest review score first, then largest
    ``reversal_z`` (set-aside items, which carry no evidence, are left out)."""
    idx = np.flatnonzero(~flags["set_aside"].to_numpy())
    score, z = flags["review_score"].to_numpy()[idx], flags["reversal_z"].to_numpy()[idx]
    return idx[np.lexsort((-z, -score))]  # ties of simulated p-values broken by the statistic


def disagreeing_subjects(bank: ItemBank, ability: np.ndarray, y: np.ndarray, items: np.ndarray,
                         subjects: np.ndarray, k: int = 3) -> list[list[dict]]:
    """For each of ``items``, the ``k`` subjects whose response the model found least likely."""
    items = np.asarray(items, dtype=np.int64)
    out = []
    for start in range(0, len(items), max(1, _CELLS // max(len(ability), 1))):
        idx = items[start:start + max(1, _CELLS // max(len(ability), 1))]
        p = bank.subset(idx).prob(ability.astype(np.float32)).astype(np.float64)  # (S, k)
        cols = y[:, idx]
        m = cols >= 0
        surprise = np.where(m, -np.log(np.clip(np.where(cols == 1, p, 1 - p), 1e-12, 1)), -np.inf)
        order = np.argsort(-surprise, axis=0, kind="stable")
        for c in range(len(idx)):
            top = order[: min(k, int(m[:, c].sum())), c]
            out.append([{"subject": str(subjects[s]), "response": int(cols[s, c]), "p_correct": float(p[s, c]),
                         "ability": float(ability[s])} for s in top])
    return out


BIN_LABELS = ("low", "med-low", "med-high", "high")


def _bins(values: np.ndarray) -> np.ndarray:
    cuts = np.quantile(values, [0.25, 0.5, 0.75])
    return np.searchsorted(cuts, values, side="right")


def quartile_table(items: pd.DataFrame, subjects: pd.DataFrame, y: np.ndarray, chosen: np.ndarray,
                   expected: np.ndarray | None = None) -> pd.DataFrame:
    """Accuracy of ``chosen`` subjects per difficulty quartile and per discrimination
    quartile (seed 002 figure 6); items with negative mean discrimination, items the fit
    set aside (``constant_response``) and items every subject answered alike are left out.

    Parameters
    ----------
    items, subjects : the run's tables (``difficulty_mean``, optional ``discrimination_mean``;
        ``subject``, ``ability_mean``).
    y : responses ``(S, N)`` in run order; chosen : subject row indices.
    expected : optional model probabilities ``(len(chosen), N)``; adds ``low_disc_excess``,
        observed minus expected accuracy on the low-discrimination quartile, which is large
        for a subject that solves poorly discriminating (likely flawed) items: overfitting.
    """
    keep = np.ones(len(items), bool)
    if "constant_response" in items:  # set aside by the fit: at the prior, no information
        keep &= ~items["constant_response"].to_numpy(bool)
    if "mean_response" in items:  # every response alike: no information for a quartile either,
        # also where the fit kept it with its data (NUTS under pooled priors), as review_items
        keep &= ~np.isin(items["mean_response"].to_numpy(), (0.0, 1.0))
    blocks = [("difficulty", items["difficulty_mean"].to_numpy())]
    if "discrimination_mean" in items:
        disc = items["discrimination_mean"].to_numpy()
        keep &= ~(disc < 0)
        blocks.append(("discrimination", disc))
    rows = {}
    sub = y[chosen][:, keep]
    obs = sub >= 0
    for name, values in blocks:
        b = _bins(values[keep])
        for k, label in enumerate(BIN_LABELS):
            sel = b == k
            with np.errstate(invalid="ignore"):
                rows[f"{name}:{label}"] = (np.where(obs[:, sel], sub[:, sel], 0).sum(1)
                                           / obs[:, sel].sum(1))
            if expected is not None and name == "discrimination" and label == "low":
                e = expected[:, keep][:, sel]
                with np.errstate(invalid="ignore"):
                    rows["low_disc_excess"] = rows[f"{name}:{label}"] - (
                        np.where(obs[:, sel], e, 0).sum(1) / obs[:, sel].sum(1))
    df = pd.DataFrame(rows)
    if "low_disc_excess" in df:
        df["low_disc_excess"] = df.pop("low_disc_excess")
    df.insert(0, "ability", subjects["ability_mean"].to_numpy()[chosen])
    df.insert(0, "subject", subjects["subject"].astype(str).to_numpy()[chosen])
    df.attrs["num_items"] = int(keep.sum())
    df.attrs["excluded_negative_discrimination"] = int(("discrimination_mean" in items) and
                                                       (items["discrimination_mean"].to_numpy() < 0).sum())
    return df


# --- adaptive selection: the per-step rule ---------------------------------------------

def strategy_scores(bank: ItemBank, strategy: str, *, rng_key: np.random.Generator) -> np.ndarray | None:
    """A fixed priority per item for the non-adaptive strategies (higher = sooner), or
    ``None`` for ``fisher``, which depends on the current ability.

    ``discrimination`` and ``disc_diff`` (discrimination + difficulty, seed 002 4.4) read
    the discrimination block when the run has one and count every item as 1 otherwise;
    ties are broken at random, as is ``random``.
    """
    if strategy not in STRATEGIES:
        raise SettingsError(f"unknown selection strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    jitter = rng_key.random(bank.num_items) * 1e-6
    if strategy == "fisher":
        return None
    if strategy == "random":
        return rng_key.random(bank.num_items)
    disc = np.asarray(bank.params.get("discrimination", np.ones(bank.num_items)), np.float64)
    diff = np.asarray(bank.params["difficulty"], np.float64)
    score = {"discrimination": disc, "disc_diff": disc + diff, "difficulty": diff}[strategy]
    return score + jitter


def next_item(available: np.ndarray, info_at_ability: np.ndarray | None,
              fixed_scores: np.ndarray | None) -> int:
    """Index of the next item to administer among ``available`` (bool mask): the most
    informative at the current ability (``fisher``) or the highest fixed score."""
    score = info_at_ability if fixed_scores is None else fixed_scores
    masked = np.where(available, score, -np.inf)
    return int(np.argmax(masked))


# --- the `items` command's tables ------------------------------------------------------

def review_items(run, y: np.ndarray, *, top: int | None = 20, num_subjects: int = 3,
                 include_set_aside: bool = False) -> pd.DataFrame:
    """The ``top`` informative items by ``review_score`` (all when ``None``) with their
    posterior summaries, flag statistics and the ``num_subjects`` subjects whose responses
    the model found least likely.

    Set-aside items (every subject answered alike) are never ranked; their ids are in
    ``table.attrs["set_aside"]``, and ``include_set_aside`` appends their rows (no score)
    after the ranked ones. ``table.attrs`` also holds ``num_flagged``, ``num_informative``
    and ``threshold``.
    """
    flags = item_flags(run.spec, run.guide, y)
    summaries = [c for c in run.items.columns if c.endswith(("_mean", "_q05", "_q95"))
                 and c != "mean_response"]
    table = pd.concat([run.items[["item"] + summaries].reset_index(drop=True), flags], axis=1)
    table.insert(0, "item_index", np.arange(len(table)))
    order = review_order(flags)[:top]
    aside = np.flatnonzero(flags["set_aside"].to_numpy())
    ranked = table.iloc[order].reset_index(drop=True)
    bank = item_bank(run.spec, run.guide)
    ability = run.subjects["ability_mean"].to_numpy()
    ids = run.subjects["subject"].astype(str).to_numpy()
    ranked["disagreeing"] = [
        "; ".join(f"{d['subject']} (y={d['response']}, p={d['p_correct']:.2f})" for d in found)
        for found in disagreeing_subjects(bank, ability, y, ranked["item_index"].to_numpy(), ids, num_subjects)]
    if include_set_aside and len(aside):
        ranked = pd.concat([ranked, table.iloc[aside].assign(disagreeing="")], ignore_index=True)
    ranked.attrs.update(set_aside=table["item"].iloc[aside].astype(str).tolist(),
                        num_flagged=int(flags["flagged"].sum()), num_informative=int(len(flags) - len(aside)),
                        threshold=FLAG_THRESHOLD)
    return ranked


def choose_subjects(run, y: np.ndarray, names: list[str] | None = None, *, num_top: int = 3,
                    num_bottom: int = 2) -> np.ndarray:
    """Row indices for the quartile table: the named subjects, or the ``num_top`` best, the
    ``num_bottom`` worst and the one with most excess accuracy on low-discrimination items."""
    ids = run.subjects["subject"].astype(str).to_numpy()
    if names:
        where = {s: i for i, s in enumerate(ids)}
        missing = [n for n in names if n not in where]
        if missing:
            raise SettingsError(f"--subjects {missing}: not subjects of run {run.path}; "
                                f"e.g. {', '.join(ids[:3])}")
        return np.asarray([where[n] for n in names])
    order = np.argsort(-run.subjects["ability_mean"].to_numpy(), kind="stable")
    picked = list(order[:num_top]) + list(order[len(order) - num_bottom:])
    excess = quartile_table(run.items, run.subjects, y, np.arange(len(ids)),
                            expected_probabilities(run, np.arange(len(ids))))
    if "low_disc_excess" in excess:
        best = int(np.nanargmax(excess["low_disc_excess"].to_numpy()))
        if best not in picked:
            picked.insert(num_top, best)
    return np.asarray(sorted(set(picked), key=picked.index))


def expected_probabilities(run, rows: np.ndarray) -> np.ndarray:
    """Model ``P(y = 1)`` of subjects ``rows`` on every item, ``(len(rows), N)``."""
    bank = item_bank(run.spec, run.guide)
    return bank.prob(run.subjects["ability_mean"].to_numpy()[rows].astype(np.float32))
