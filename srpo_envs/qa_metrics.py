"""SQuAD-style answer normalisation, exact match and token F1 for open-domain QA rewards and evals.

These follow the official SQuAD v1.1 script (lower-case, strip punctuation and the articles
a/an/the, collapse whitespace) - the same normalisation Search-R1, FlashRAG and the HotpotQA
evaluator use, so scores are comparable with published numbers. Two details from the HotpotQA
evaluator are kept because its data (and 2Wiki's) has yes/no answers: a yes/no/noanswer
prediction gets F1 0 unless it matches exactly (token overlap would otherwise credit "no" against
"no" in "no, it is not"). Multiple gold answers (aliases) are scored by the best match.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)
_SPECIAL = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop articles, collapse whitespace (SQuAD v1.1)."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(golds: str | Iterable[str]) -> list[str]:
    return [golds] if isinstance(golds, str) else [g for g in golds if isinstance(g, str)]


def exact_match(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0."""
    if pred is None:
        return 0.0
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in _golds(golds)))


def _f1_single(pred: str, gold: str) -> float:
    p_norm, g_norm = normalize_answer(pred), normalize_answer(gold)
    if (p_norm in _SPECIAL or g_norm in _SPECIAL) and p_norm != g_norm:
        return 0.0
    p_toks, g_toks = p_norm.split(), g_norm.split()
    if not p_toks or not g_toks:  # an empty side scores 1 only against another empty side
        return float(p_toks == g_toks)
    common = Counter(p_toks) & Counter(g_toks)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p_toks), overlap / len(g_toks)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str | None, golds: str | Iterable[str]) -> float:
    """Best token-level F1 between the prediction and any gold answer (0.0 for ``None``/no golds)."""
    if pred is None:
        return 0.0
    return max((_f1_single(pred, g) for g in _golds(golds)), default=0.0)


def cover_match(pred: str | None, golds: str | Iterable[str]) -> float:
    """1.0 if some normalised gold answer occurs inside the normalised prediction (token-aligned).

    Looser than EM ("Paris, France" covers "Paris"); useful as a diagnostic, not as a reward,
    since a policy can game it with long answers.
    """
    if pred is None:
        return 0.0
    p = f" {normalize_answer(pred)} "
    return float(any(g and f" {g} " in p for g in map(normalize_answer, _golds(golds))))
