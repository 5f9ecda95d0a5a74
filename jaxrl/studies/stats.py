"""Statistics of the studies: Spearman and Pearson correlations, and OLS with task-clustered standard errors.

Pure numpy/scipy functions. `ols_clustered` is the regression of the paper's
lexical analysis (F1 on standardized measures of the thinking, with model fixed
effects): ordinary least squares, and the cluster-robust (sandwich) covariance

    V = c · (XᵀX)⁻¹ (Σ_g X_gᵀ u_g u_gᵀ X_g) (XᵀX)⁻¹,   c = G/(G−1) · (N−1)/(N−P)

over G clusters (tasks), N rows and P regressors: the CR1 small-sample factor,
the same as statsmodels' `cov_type="cluster"` default, which the tests compare
against. p-values use the normal distribution, as statsmodels does by default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; NaN when fewer than two pairs or either side is constant."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    dx, dy = x - x.mean(), y - y.mean()
    return float((dx @ dy) / math.sqrt((dx @ dx) * (dy @ dy)))


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(Spearman's ρ, two-sided p): Pearson's r of the ranks (ties get their mean rank); NaNs when undefined."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rho = pearson(sps.rankdata(x), sps.rankdata(y))
    if math.isnan(rho) or len(x) < 3:
        return rho, math.nan
    if abs(rho) >= 1:
        return rho, 0.0
    t = rho * math.sqrt((len(x) - 2) / (1 - rho * rho))
    return rho, float(2 * sps.t.sf(abs(t), len(x) - 2))


def standardize(x: Sequence[float]) -> np.ndarray:
    """(x − mean) / std (population std); a constant column becomes zeros."""
    x = np.asarray(x, float)
    sd = x.std()
    return np.zeros_like(x) if sd == 0 else (x - x.mean()) / sd


@dataclasses.dataclass(frozen=True)
class OLSResult:
    """An OLS fit: per regressor its coefficient, clustered standard error, z and p.

    Attributes:
        names: regressor names (`const`, the measures, then `model[NAME]` dummies).
        coef, se, z, p: arrays in the order of `names`.
        n: rows; clusters: distinct clusters; r2: the coefficient of determination.
    """

    names: tuple[str, ...]
    coef: np.ndarray
    se: np.ndarray
    z: np.ndarray
    p: np.ndarray
    n: int
    clusters: int
    r2: float


def design(measures: dict[str, Sequence[float]], groups: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """The design matrix: a constant, the measures as given, then one dummy per group but the first (sorted)."""
    columns = [np.ones(len(next(iter(measures.values()))))] + [np.asarray(v, float) for v in measures.values()]
    names = ["const", *measures]
    if groups is not None:
        levels = sorted(set(groups))
        for level in levels[1:]:
            columns.append(np.array([g == level for g in groups], float))
            names.append(f"model[{level}]")
    return np.column_stack(columns), names


def ols_clustered(y: Sequence[float], x: np.ndarray, clusters: Sequence[str], names: Sequence[str]) -> OLSResult:
    """OLS of y on the columns of x with cluster-robust (CR1) standard errors; see the module docstring.

    Raises:
        ValueError: fewer rows than regressors, fewer than two clusters, or a rank-deficient design.
    """
    y, x = np.asarray(y, float), np.asarray(x, float)
    n, k = x.shape
    ids = sorted(set(clusters))
    if n <= k or len(ids) < 2:
        raise ValueError(f"OLS needs more rows than regressors and two clusters; got {n} rows, {k} regressors, "
                         f"{len(ids)} clusters")
    if np.linalg.matrix_rank(x) < k:
        raise ValueError("the design is rank-deficient (a measure is constant or collinear with another)")
    xtx_inv = np.linalg.inv(x.T @ x)
    coef = xtx_inv @ x.T @ y
    resid = y - x @ coef
    index = {c: i for i, c in enumerate(ids)}
    scores = np.zeros((len(ids), k))
    np.add.at(scores, np.array([index[c] for c in clusters]), x * resid[:, None])
    g = len(ids)
    factor = g / (g - 1) * (n - 1) / (n - k)
    cov = factor * xtx_inv @ (scores.T @ scores) @ xtx_inv
    se = np.sqrt(np.diag(cov))
    z = coef / se
    total = ((y - y.mean()) ** 2).sum()
    r2 = float(1 - (resid @ resid) / total) if total > 0 else math.nan
    return OLSResult(tuple(names), coef, se, z, 2 * sps.norm.sf(np.abs(z)), n, g, r2)
