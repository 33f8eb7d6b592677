"""The parts of a claim: what a paper states (a target), what we measured (ours), and the verdict between them.

A target is one of: :class:`Effect` (a factor or percentage the paper states), :class:`Share` (a share it bounds
or gives a range for), :class:`Near` (a value it gives as approximate) and :class:`Ordering` (no number: an
ordering that should hold in every cell of its grid). Each says whether our value is within its tolerance
(``contains``) and, when it has one, which sign is the paper's direction (``direction``). The verdict:

- ``reproduced``: ours within the tolerance of the paper's number, and in its direction;
- ``direction only``: the same sign or ordering, the magnitude outside the tolerance (an ordering: it holds
  in most cells, not all);
- ``differs``: not even the direction; the claim's cause says why;
- ``not run``: no result to measure, or nothing of ours to compare with (the cause says which);
- ``by construction``: a claim our model makes true by how it is built (an admission rule's arithmetic, a
  term calibrated on the very figure): it holds, and the cause says why, but it reproduces nothing.

The helpers at the end measure a claim on a sweep's results table (one row per cell).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd

REPRODUCED, DIRECTION_ONLY, DIFFERS, NOT_RUN = "reproduced", "direction only", "differs", "not run"
BY_CONSTRUCTION = "by construction"
VERDICTS = (REPRODUCED, DIRECTION_ONLY, DIFFERS, BY_CONSTRUCTION, NOT_RUN)
# the tolerance of every number the papers state, and why (FINDINGS.md repeats this)
EFFECT_TOLERANCE = 0.25
COMPARABLE = 0.25      # the one reading of "comparable", "similar", "≈ 1": within ±25 % (the effect tolerance)
TOLERANCE_NOTE = (
    "A factor or percentage the paper states is reproduced when our effect (factor − 1; a reduction by r is "
    "the factor 1 / (1 − r)) is within ±25 % of the paper's effect (a range is widened by 25 % at each end). "
    "Why 25 %: the paper's numbers come from its own cost-model fit, which it reports to be 3–30 % off the real "
    "system (InferMax App. A.2); ours is another fit of the same kind of profiles, so a ratio of two simulated "
    "runs cannot be expected to agree more closely. Where a paper gives one number per model or per cell, "
    "each row is held to its own number, not to the range over models or cells. A bound the paper states "
    "(> 90 %, < 20 %) is its own tolerance, and a share the paper gives (92-100 %) is held to the paper's "
    "range, not widened. 'Comparable', 'similar' and '≈ 1' have one reading: within ±25 %. A claim without a "
    "number (an ordering) is reproduced when it holds in every cell of the grid the paper shows, direction "
    "only when it holds in most of them. A claim our model makes true by how it is built (by construction) "
    "is shown as such and not counted as a reproduction.")

TIE = 1e-9          # relative: floats this close are equal, not an ordering


# --- what a paper states ----------------------------------------------------------------------------
def fmt_factor(v: float, unit: str) -> str:
    """A factor the way the paper writes it: ``13x``, ``+6.9 %`` (an increase), ``40.9 %`` (a reduction)."""
    if not math.isfinite(v):
        return str(v)
    if unit == "%+" and v < 10:
        return f"{(v - 1) * 100:+.1f} %"
    if unit == "%-" and 0 < v < 1:               # the other way: as many times more
        return f"{1 / v:.3g}x more"
    if unit == "%-" and v > 0:
        return f"{(1 - 1 / v) * 100:.1f} % less"
    if unit == "to" and v > 0:                    # "drops to 0.64x": the factor 1 / 0.64
        return f"to {1 / v:.3g}x"
    return f"{v:.0f}x" if v >= 100 else f"{v:.3g}x"


@dataclass(frozen=True, kw_only=True, slots=True)
class Effect:
    """A factor the paper reports, ``lo`` (one number) or ``lo``..``hi`` (a range), oriented so that > 1 is
    the paper's direction. ``unit`` is how the paper writes it: ``x``, ``%+`` (an increase), ``%-`` (a
    reduction by r, stored as the factor 1 / (1 − r)) or ``to`` ("drops to y×", stored as 1 / y). Ours is
    within tolerance when its effect, factor − 1, lies within ±``tol`` of the paper's effect. ``source``: the
    paper's own numbers the factor is computed from, when it states those instead (two counts of a table)."""
    lo: float
    hi: float | None = None
    unit: str = "x"
    tol: float = EFFECT_TOLERANCE
    source: tuple[float, ...] = ()

    def bounds(self) -> tuple[float, float]:
        hi = self.lo if self.hi is None else self.hi
        return 1 + (self.lo - 1) * (1 - self.tol), 1 + (hi - 1) * (1 + self.tol)

    def contains(self, value: float) -> bool:
        lo, hi = self.bounds()
        return lo <= value <= hi

    def direction(self, value: float) -> bool:
        return value > 1

    def number(self) -> str:
        one = fmt_factor(self.lo, self.unit)
        return one if self.hi is None else f"{one} – {fmt_factor(self.hi, self.unit)}"

    def tolerance(self) -> str:
        lo, hi = self.bounds()
        return f"±{self.tol:.0%} of the effect: {fmt_factor(lo, self.unit)} .. {fmt_factor(hi, self.unit)}"

    def show(self, value: float) -> str:
        return fmt_factor(value, self.unit)


@dataclass(frozen=True, kw_only=True, slots=True)
class Share:
    """A share (0..1) the paper bounds or gives a range for: within ``lo``..``hi``, never widened (a bound
    is its own tolerance, and so is a range the paper states). ``why``: the bound is our reading of a word
    of the paper ("close"), not a number it states."""
    lo: float = 0.0
    hi: float = 1.0
    why: str = ""

    def contains(self, value: float) -> bool:
        return self.lo - 1e-12 <= value <= self.hi + 1e-12

    def direction(self, value: float) -> bool | None:
        return None          # a bound has no sign of its own; a claim gives its direction with its number

    def number(self) -> str:
        if self.why:
            return "no number"
        if self.lo == 0:
            return f"< {self.hi:.0%}"
        if self.lo == self.hi:
            return f"{self.lo:.0%}"
        return f"> {self.lo:.0%}" if self.hi == 1 else f"{self.lo:.0%} – {self.hi:.0%}"

    def tolerance(self) -> str:
        if self.why:
            return self.why
        return "the paper's bound" if self.lo == 0 or self.hi == 1 else "the paper's range (not widened)"

    def show(self, value: float) -> str:
        return f"{value:.1%}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Near:
    """A value the paper gives as approximate ("≈ 98", "comparable", "peaks at 128"): within ±``tol``
    (relative) of ``value``; ``why`` says how the tolerance reads the paper's word."""
    value: float
    tol: float
    why: str

    def contains(self, value: float) -> bool:
        return abs(value - self.value) <= self.tol * abs(self.value) + 1e-12

    def direction(self, value: float) -> bool | None:
        return None

    def number(self) -> str:
        return f"≈ {self.value:g}"

    def tolerance(self) -> str:
        return f"±{self.tol:.0%} ({self.why})" if self.tol else self.why

    def show(self, value: float) -> str:
        return f"{value:.3g}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Ordering:
    """A claim without a number: an ordering that should hold in every cell of the grid. Ours is the
    share of cells where it holds."""
    paper: str = "qualitative"

    def contains(self, value: float) -> bool:
        return value == 1

    def direction(self, value: float) -> bool:
        return value > 0.5

    def number(self) -> str:
        return self.paper

    def tolerance(self) -> str:
        return "every cell (direction only: most cells)"

    def show(self, value: float) -> str:
        return f"{value:.0%} of cells"


@dataclass(frozen=True, kw_only=True, slots=True)
class PerCell:
    """A factor the paper gives for every cell of a grid ("6.1-7.5x over models and datasets"): each cell is
    held to ``effect`` (its tolerance), not only the largest. Ours is the share of cells within it; the
    direction, that every cell has the paper's sign, comes with it (``Ours.holds``)."""
    effect: Effect

    def contains(self, value: float) -> bool:
        return value == 1

    def direction(self, value: float) -> bool | None:
        return None

    def number(self) -> str:
        return self.effect.number()

    def tolerance(self) -> str:
        return self.effect.tolerance() + ", in every cell"

    def show(self, value: float) -> str:
        return f"{value:.0%} of cells"


def per_cell(ratio: pd.Series, effect: Effect) -> Ours:
    """A :class:`PerCell` claim measured on the ratio of every cell: the share within ``effect``, the range of
    ratios and where they lie; its direction holds when every cell exceeds 1."""
    ratio = ratio.dropna()
    if ratio.empty:
        raise Missing("no cells")
    within = ratio.map(effect.contains)

    def where(at) -> str:
        return ", ".join(f"{v}" for v in (at if isinstance(at, tuple) else (at,)))
    text = (f"{int(within.sum())}/{len(ratio)} cells within: {effect.show(ratio.min())} ({where(ratio.idxmin())}) "
            f".. {effect.show(ratio.max())} ({where(ratio.idxmax())})")
    return Ours(float(within.mean()), text, holds=bool((ratio > 1).all()))


def comparable(word: str = "comparable", value: float = 1.0) -> Near:
    """The one reading of "comparable" / "similar" / "≈ 1" across the table: within ±:data:`COMPARABLE`."""
    return Near(value=value, tol=COMPARABLE, why=f"'{word}' read as within {COMPARABLE:.0%}, as every "
                                                 f"'comparable' of the table")


Target = Effect | Share | Near | Ordering | PerCell


class Ours(NamedTuple):
    """Our number for a claim: ``value`` (compared with the target), ``text`` (as the table shows it, with
    where it was found) and ``holds``, the claim's direction when it is not the target's own sign."""
    value: float
    text: str
    holds: bool | None = None


class Missing(LookupError):
    """A results table lacks what a claim needs (a SMALL grid without the cells, or no FULL run yet)."""


def cells(mask) -> Ours:
    """An ordering measured over a boolean Series of cells: the share that holds, and ``k/n cells``."""
    mask = pd.Series(mask, dtype=bool)
    if mask.empty:
        raise Missing("no cells")
    return Ours(float(mask.mean()), f"{int(mask.sum())}/{len(mask)} cells")


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """One paper claim, ours measured by ``measure(results)``; ``target=None``: nothing of ours to compare
    with (the cause says why). ``cause`` explains a verdict other than ``reproduced``."""
    notebook: str
    paper: str
    section: str
    statement: str
    target: Target | None
    measure: Callable[[pd.DataFrame], Ours] | None
    cause: str = ""
    construction: str = ""        # why our model makes the claim true by how it is built ("": it does not)

    def evaluate(self, results: pd.DataFrame | None) -> dict:
        ours = None
        if self.target is not None and self.measure is not None and results is not None:
            try:
                ours = self.measure(results)
            except (Missing, KeyError):
                ours = None
        verdict = verdict_of(self.target, ours)
        cause = "" if verdict == REPRODUCED else self.cause
        if verdict == REPRODUCED and self.construction:
            verdict, cause = BY_CONSTRUCTION, self.construction
        if verdict == NOT_RUN and self.target is not None:
            cause = ("no full-scale result yet (python notebooks/findings.py --rerun " + self.notebook + ")"
                     if results is None else "the results lack the cells this claim needs")
        return {"notebook": self.notebook[:2], "paper": self.paper, "section": self.section,
                "claim": self.statement, "paper_number": "-" if self.target is None else self.target.number(),
                "ours": "-" if ours is None else ours.text,
                "tolerance": "-" if self.target is None else self.target.tolerance(),
                "verdict": verdict, "cause": cause,
                "holds": None if ours is None else holds_of(self.target, ours)}


def holds_of(target: Target, ours: Ours) -> bool | None:
    """The claim's direction in our numbers: the claim's own, else the target's sign (None: the claim has
    no direction apart from its number, e.g. "≈ 98")."""
    return target.direction(ours.value) if ours.holds is None else bool(ours.holds)


def verdict_of(target: Target | None, ours: Ours | None) -> str:
    if target is None or ours is None or not math.isfinite(ours.value):
        return NOT_RUN
    holds, within = holds_of(target, ours), target.contains(ours.value)
    if holds is None:
        return REPRODUCED if within else DIFFERS
    if holds and within:
        return REPRODUCED
    return DIRECTION_ONLY if holds else DIFFERS


# --- measuring a claim on a results table ------------------------------------------------------------
def registrar(claims: list[Claim], paper: str, notebook: str | None = None):
    """A decorator: ``@claim(notebook, section, statement, target[, cause][, construction=why])`` (without
    ``notebook`` when it is fixed here) registers the decorated measure as one claim of ``paper`` in
    ``claims``; ``construction``: why the claim holds by how our model is built (verdict ``by construction``)."""
    def claim(*args, construction: str = ""):
        nb, section, statement, target, *cause = (notebook, *args) if notebook is not None else args

        def register(measure):
            claims.append(Claim(notebook=nb, paper=paper, section=section, statement=statement, target=target,
                                measure=measure, cause=cause[0] if cause else "", construction=construction))
            return measure
        return register
    return claim


def select(df: pd.DataFrame, column: str, value: str, index: str) -> pd.DataFrame:
    """The rows of ``df`` whose ``column`` is ``value``, indexed by ``index`` (:class:`Missing` if none)."""
    out = df[df[column] == value].set_index(index)
    if out.empty:
        raise Missing(value)
    return out


def wide(df: pd.DataFrame, metric: str, index, columns="policy") -> pd.DataFrame:
    """``metric`` pivoted to ``index`` x ``columns`` (raises :class:`Missing` when there are no such cells)."""
    out = df.pivot_table(index=index, columns=columns, values=metric)
    if out.empty:
        raise Missing(metric)
    return out


def peak(ratio: pd.Series, unit: str = "x", majority: bool = True) -> Ours:
    """An "up to" claim: the largest ratio over the grid and where it is. Its direction: ratio > 1 in most
    cells when the paper says the effect is general (``majority``), else at the peak."""
    ratio = ratio.dropna()
    if ratio.empty:
        raise Missing("no cells")
    at = ratio.idxmax()
    where = ", ".join(f"{n} = {v}" for n, v in zip(ratio.index.names, at if isinstance(at, tuple) else (at,)))
    share = float((ratio > 1).mean())
    text = f"{fmt_factor(ratio.max(), unit)} ({where}); > 1 in {int((ratio > 1).sum())}/{len(ratio)} cells"
    return Ours(float(ratio.max()), text, holds=share > 0.5 if majority else bool(ratio.max() > 1))


def steps(series_by_row: pd.DataFrame, rising: bool, slack: float = TIE) -> pd.Series:
    """Each step along the columns of every row: True where the row rises (falls) by the step, allowing a
    relative ``slack``."""
    a = series_by_row.to_numpy(dtype=float)
    prev, nxt = a[:, :-1], a[:, 1:]
    ok = nxt >= prev * (1 - slack) if rising else nxt < prev * (1 + slack)
    return pd.Series(ok[~np.isnan(prev) & ~np.isnan(nxt)])
