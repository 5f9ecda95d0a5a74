"""Lexical measures of thinking traces: pure str -> value functions.

Words are the prose of a trace: fenced code blocks and inline `code` spans are
removed first (a quoted program is not prose), then words are maximal runs of
letters with inner apostrophes or hyphens, lower-cased ("don't", "off-by-one").

- `lexicon_rate`: matches of a lexicon per 1,000 prose words. A lexicon is a set
  of phrases (word sequences); at each word position the longest phrase that
  matches is counted and the scan jumps past it, so "no wait" is one match of
  self-correction, not "no wait" plus "wait".
- `mattr`: moving-average type-token ratio (Covington & McFall 2010) over
  windows of `window` words; a shorter text gets its plain type-token ratio.
- `repetition`: the share of a trace's word n-grams (n = 4) that repeat an earlier one.
- `quotes`: which of the buggy program's lines (by 1-based number) appear verbatim
  in the trace, whitespace collapsed.
- `log_odds`: weighted log-odds ratios with an informative Dirichlet prior
  (Monroe, Colaresi & Quinn 2008), here over bigrams:
      δ_w = log((y_aw + α_w) / (n_a + α_0 − y_aw − α_w)) − log((y_bw + α_w) / (n_b + α_0 − y_bw − α_w)),
      σ²_w ≈ 1/(y_aw + α_w) + 1/(y_bw + α_w),   z_w = δ_w / σ_w,
  with the prior α_w = s · (y_aw + y_bw) the pooled counts scaled by s, α_0 = Σ_w α_w.
- `jensen_shannon`: JS divergence of two word distributions, in bits (0 to 1).
- `tfidf_cosine`: cosine of TF-IDF vectors (raw counts times the smoothed idf
  ln((1 + D)/(1 + df)) + 1 over the D documents given).
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources

WORD = re.compile(r"[a-z]+(?:['’-][a-z]+)*")
FENCED = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^ {0,3}\1[ \t]*$|\Z)", re.S | re.M)
INLINE = re.compile(r"`[^`\n]+`")


def prose(text: str) -> str:
    """The text with fenced code blocks (an unclosed one runs to the end) and inline code spans removed."""
    return INLINE.sub(" ", FENCED.sub(" ", text))


def words(text: str) -> list[str]:
    """The lower-cased prose words of a text."""
    return WORD.findall(prose(text).lower().replace("’", "'"))


def phrase_words(phrase: str) -> tuple[str, ...]:
    """A lexicon phrase as the word sequence it matches."""
    return tuple(WORD.findall(phrase.lower()))


def load_lexicons() -> dict[str, frozenset[tuple[str, ...]]]:
    """The lexicons shipped in `jaxrl/studies/lexicons/*.txt`, by file name."""
    out = {}
    for item in sorted(resources.files("jaxrl.studies").joinpath("lexicons").iterdir(), key=lambda p: p.name):
        if item.name.endswith(".txt"):
            out[item.name[:-4]] = parse_lexicon(item.read_text(encoding="utf-8"))
    return out


def parse_lexicon(text: str) -> frozenset[tuple[str, ...]]:
    """Phrases of a lexicon file: one a line, `#` starts a comment line."""
    lines = (line.strip() for line in text.splitlines())
    return frozenset(p for p in (phrase_words(line) for line in lines if line and not line.startswith("#")) if p)


def lexicon_count(tokens: Sequence[str], lexicon: Iterable[tuple[str, ...]]) -> int:
    """Matches of a lexicon in a word sequence: longest phrase first at each place, no overlaps."""
    by_first: dict[str, list[tuple[str, ...]]] = collections.defaultdict(list)
    for phrase in lexicon:
        by_first[phrase[0]].append(phrase)
    for group in by_first.values():
        group.sort(key=len, reverse=True)
    count, i = 0, 0
    while i < len(tokens):
        match = next((p for p in by_first.get(tokens[i], ()) if tuple(tokens[i:i + len(p)]) == p), None)
        if match:
            count, i = count + 1, i + len(match)
        else:
            i += 1
    return count


def lexicon_rate(tokens: Sequence[str], lexicon: Iterable[tuple[str, ...]]) -> float:
    """Matches per 1,000 words; NaN for no words."""
    return 1000.0 * lexicon_count(tokens, lexicon) / len(tokens) if tokens else math.nan


def mattr(tokens: Sequence[str], window: int = 50) -> float:
    """Moving-average type-token ratio; NaN for no words."""
    if not tokens:
        return math.nan
    if len(tokens) <= window:
        return len(set(tokens)) / len(tokens)
    counts = collections.Counter(tokens[:window])
    total = len(counts)
    for i in range(window, len(tokens)):
        out = tokens[i - window]
        counts[out] -= 1
        if counts[out] == 0:
            del counts[out]
        counts[tokens[i]] += 1
        total += len(counts)
    return total / (len(tokens) - window + 1) / window


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The word n-grams of a sequence, in order."""
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def repetition(tokens: Sequence[str], n: int = 4) -> float:
    """Share of the n-grams that repeat an earlier n-gram of the same text; 0 with no n-gram."""
    grams = ngrams(tokens, n)
    return (len(grams) - len(set(grams))) / len(grams) if grams else 0.0


def _collapse(text: str) -> str:
    return " ".join(text.split())


def quotes(thinking: str, program: str, line_numbers: Iterable[int]) -> dict[int, bool]:
    """For each 1-based line number of `program` (blank lines skipped), whether the trace quotes it verbatim."""
    lines = program.split("\n")
    hay = _collapse(thinking)
    out = {}
    for number in line_numbers:
        if 1 <= number <= len(lines) and lines[number - 1].strip():
            out[number] = _collapse(lines[number - 1]) in hay
    return out


def log_odds(counts_a: Mapping[str, int], counts_b: Mapping[str, int], prior_scale: float = 1.0
             ) -> dict[str, float]:
    """z-scores of the weighted log-odds of each key, A against B (positive: more typical of A)."""
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    keys = set(counts_a) | set(counts_b)
    alpha = {w: prior_scale * (counts_a.get(w, 0) + counts_b.get(w, 0)) for w in keys}
    alpha0 = sum(alpha.values())
    out = {}
    for w in keys:
        ya, yb, a = counts_a.get(w, 0), counts_b.get(w, 0), alpha[w]
        delta = math.log((ya + a) / (n_a + alpha0 - ya - a)) - math.log((yb + a) / (n_b + alpha0 - yb - a))
        out[w] = delta / math.sqrt(1 / (ya + a) + 1 / (yb + a))
    return out


def jensen_shannon(counts_a: Mapping[str, int], counts_b: Mapping[str, int]) -> float:
    """JS divergence (bits) of the two normalized count distributions; NaN when either is empty."""
    n_a, n_b = sum(counts_a.values()), sum(counts_b.values())
    if not n_a or not n_b:
        return math.nan
    total = 0.0
    for w in set(counts_a) | set(counts_b):
        p, q = counts_a.get(w, 0) / n_a, counts_b.get(w, 0) / n_b
        m = (p + q) / 2
        total += (p * math.log2(p / m) if p else 0.0) + (q * math.log2(q / m) if q else 0.0)
    return total / 2


def tfidf_vectors(documents: Sequence[Sequence[str]]) -> list[dict[str, float]]:
    """TF-IDF vectors of word documents: raw counts times ln((1 + D)/(1 + df)) + 1."""
    df = collections.Counter(w for doc in documents for w in set(doc))
    d = len(documents)
    idf = {w: math.log((1 + d) / (1 + n)) + 1 for w, n in df.items()}
    return [{w: c * idf[w] for w, c in collections.Counter(doc).items()} for doc in documents]


def cosine(u: Mapping[str, float], v: Mapping[str, float]) -> float:
    """Cosine of two sparse vectors; NaN when either is zero."""
    nu, nv = math.sqrt(sum(x * x for x in u.values())), math.sqrt(sum(x * x for x in v.values()))
    if not nu or not nv:
        return math.nan
    return sum(x * v.get(w, 0.0) for w, x in u.items()) / (nu * nv)
