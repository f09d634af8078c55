"""Full-text search over the segments of every transcript in a library.

The index is an FTS5 table with the trigram tokenizer over the segments' text (store.py, migration 2,
kept in step with the segments by triggers in the same transactions): it matches any substring of three
characters or more, in any script and without word boundaries, so Chinese, Japanese, Korean, Latin and
mixed text are all found, case-insensitively ("café" finds "Café"; accents are not folded: "cafe" does
not find "café").

A query is FTS5 query syntax: terms are ANDed; "quoted phrases"; OR, NOT and parentheses; term* for a
prefix (with a trigram index, the same as the word anywhere in the text). A query that uses none of that (only words and "quoted phrases") is read literally: every word
must occur as it is written, punctuation included ("don't", "e-mail", "10:30"). Trigrams cannot match
a term shorter than three characters (a single Chinese character, "東京"): in a literal query such terms
are looked up by scanning the segments' text instead (case-insensitively), and the other terms, if any,
by the index; in a query using FTS5 operators, a term shorter than three characters matches nothing.

Hits are ranked (score: higher is better; see _score: whole words, same case, short segments first) when
a query matches at most RANKED_HITS segments;
a query matching more (a common word in a large library), and one answered by scanning alone (score 0),
lists the most recently added segments first. count() gives the number of hits of a query: a second
query, which reads every hit.
"""

from __future__ import annotations

import html
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from mlx_qwen3asr.library.store import Library, LibraryError
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["MAX_HITS", "MAX_QUERY_CHARS", "RANKED_HITS", "SNIPPET_CHARS", "SearchError", "count", "search"]

MAX_QUERY_CHARS = 1000
SNIPPET_CHARS = 200
# The shortest term the trigram index can match.
TRIGRAM = 3
# A query matching more segments than this lists them most recently added first instead of by score.
RANKED_HITS = 1000
# The most hits one search returns (a larger limit is cut to this).
MAX_HITS = 1000
# Where a hit starts and ends in a snippet before it is escaped: private-use characters, which no
# transcript is expected to hold (any there are dropped, or balanced, never passed through as markup).
_OPEN, _CLOSE = "\ue000", "\ue001"
_MARKS = re.compile(f"([{_OPEN}{_CLOSE}])")
_OPERATORS = frozenset({"AND", "OR", "NOT"})


class SearchError(LibraryError):
    """The query cannot be searched for: empty, too long, or not valid FTS5 syntax."""


@dataclass
class _Plan:
    """How a query is run: `match` for the index (None: scan only), `short` terms every hit's text
    must contain (case-insensitively), `terms` to mark in snippets (None: FTS5 marks them)."""

    match: str | None
    short: list[str]
    terms: list[str] | None


def _literal_terms(q: str) -> list[str] | None:
    """The words and "quoted phrases" of a query that uses no FTS5 operator; None when it uses one (OR,
    AND, NOT, parentheses, *, an unterminated or attached quote)."""
    terms: list[str] = []
    i, n = 0, len(q)
    while i < n:
        if q[i].isspace():
            i += 1
            continue
        if q[i] == '"':
            j, chars = i + 1, []
            while True:
                if j >= n:
                    return None
                if q[j] == '"':
                    if j + 1 < n and q[j + 1] == '"':
                        chars.append('"')
                        j += 2
                        continue
                    break
                chars.append(q[j])
                j += 1
            if j + 1 < n and not q[j + 1].isspace():
                return None
            phrase = "".join(chars)
            if phrase.strip():
                terms.append(phrase)
            i = j + 1
            continue
        j = i
        while j < n and not q[j].isspace():
            j += 1
        word = q[i:j]
        if word in _OPERATORS or any(c in word for c in '"*()'):
            return None
        terms.append(word)
        i = j
    return terms


def _phrase(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def _plan(q: Any) -> _Plan:
    if not isinstance(q, str) or not q.strip():
        raise SearchError("an empty search: give a word or phrase to look for")
    q = q.strip()
    if len(q) > MAX_QUERY_CHARS:
        raise SearchError(f"a search of {len(q)} characters: at most {MAX_QUERY_CHARS}")
    terms = _literal_terms(q)
    if terms is None:
        # A trigram index finds a word anywhere in the text: "word*" is looked up as the substring "word"
        # (which finds what the prefix finds, and the word inside longer ones), not by FTS5's prefix
        # scan, which reads the index's every trigram that starts with it.
        return _Plan(_PREFIX.sub(r'"\1"', q), [], None)
    if not terms:
        raise SearchError(f"search {_shown(q)}: nothing to look for")
    long = [t for t in terms if len(t) >= TRIGRAM]
    short = [t for t in terms if len(t) < TRIGRAM]
    return _Plan(" AND ".join(map(_phrase, long)) or None, short, terms)


def _shown(q: str) -> str:
    return repr(q if len(q) <= 80 else q[:77] + "...")


def _variants(term: str) -> list[str]:
    """The term with each character in every case it has (as one character): what a case-insensitive
    scan for a short term looks for (at most 3 ** 2 strings)."""
    choices = []
    for ch in term:
        forms = {ch}
        for form in (ch.lower(), ch.upper(), ch.title()):
            if len(form) == 1:
                forms.add(form)
        choices.append(sorted(forms))
    return ["".join(p) for p in product(*choices)]


def _filters(plan: _Plan, transcript_id: str | None) -> tuple[list[str], list[Any]]:
    """SQL conditions on the segments table `s` (and their parameters): the short terms, the transcript."""
    sql: list[str] = []
    params: list[Any] = []
    for term in plan.short:
        forms = _variants(term)
        sql.append("(" + " OR ".join(["instr(s.text, ?) > 0"] * len(forms)) + ")")
        params.extend(forms)
    if transcript_id is not None:
        sql.append("s.transcript_id = ?")
        params.append(transcript_id)
    return sql, params


def _fold(text: str) -> str:
    """Lower case, one character for one, so that positions in the result are positions in text."""
    return "".join(c if len(low := c.lower()) != 1 else low for c in text)


def _mark_terms(text: str, terms: Sequence[str]) -> str:
    """text with every occurrence of the terms (case-insensitive) between the private markers."""
    text = text.replace(_OPEN, "").replace(_CLOSE, "")
    folded = _fold(text)
    spans: list[tuple[int, int]] = []
    for term in terms:
        needle = _fold(term)
        at = folded.find(needle)
        while needle and at >= 0:
            spans.append((at, at + len(needle)))
            at = folded.find(needle, at + 1)
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, at = [], 0
    for start, end in merged:
        out += [text[at:start], _OPEN, text[start:end], _CLOSE]
        at = end
    out.append(text[at:])
    return "".join(out)


def _snippet(marked: str) -> str:
    """HTML for a hit's text with the markers made <mark>...</mark>: at most SNIPPET_CHARS characters
    around the first hit ("…" where cut), everything else escaped, the marks always balanced."""
    if len(marked) > SNIPPET_CHARS:
        first = max(0, marked.find(_OPEN))
        start = max(0, first - SNIPPET_CHARS // 4)
        space = marked.rfind(" ", max(0, start - 20), start + 1)
        if 0 < space < first:
            start = space + 1
        end = min(len(marked), start + SNIPPET_CHARS)
        start = max(0, end - SNIPPET_CHARS) if end == len(marked) else start
        marked = ("…" if start > 0 else "") + marked[start:end] + ("…" if end < len(marked) else "")
    out, open_ = [], False
    for part in _MARKS.split(marked):
        if part == _OPEN:
            if not open_:
                out.append("<mark>")
            open_ = True
        elif part == _CLOSE:
            if open_:
                out.append("</mark>")
            open_ = False
        elif part:
            out.append(html.escape(part, quote=True))
    if open_:
        out.append("</mark>")
    return "".join(out).replace("</mark><mark>", "")


def _rarest_term_hits(conn: sqlite3.Connection, plan: _Plan) -> list[int] | None:
    """For a literal query of several terms: the keys of its rarest term's hits (at most RANKED_HITS),
    among which the segments holding every term are (the caller looks for the others in their text, as
    the index matches them: case-insensitive substrings). None when it is one term, or every term is
    common: the index then intersects them itself. FTS5 intersects terms by walking every term's hit
    list, however rare one of them is, which costs a common word's whole list."""
    if plan.terms is None or plan.match is None or len(plan.terms) < 2:
        return None
    terms = [t for t in plan.terms if len(t) >= TRIGRAM]
    # A few hits of each first: a rare term is found complete at little cost; only if none is, more.
    for limit in (RANKED_HITS // 10, RANKED_HITS):
        best: list[int] | None = None
        for term in terms:
            hits = [
                r[0]
                for r in conn.execute(
                    "SELECT rowid FROM segments_fts WHERE segments_fts MATCH ? ORDER BY rowid DESC LIMIT ?",
                    (_phrase(term), limit + 1),
                )
            ]
            if len(hits) <= limit and (best is None or len(hits) < len(best)):
                best = hits
        if best is not None:
            return best
    return None


def _texts(conn: sqlite3.Connection, keys: Sequence[int]) -> dict[int, str]:
    """The text of the segments with these keys."""
    out: dict[int, str] = {}
    for at in range(0, len(keys), 500):
        chunk = keys[at : at + 500]
        out.update(
            conn.execute(
                "SELECT key, text FROM segments WHERE key IN (" + ", ".join("?" * len(chunk)) + ")", chunk
            ).fetchall()
        )
    return out


_PREFIX = re.compile(rf'(?<![\w"])(\w{{{TRIGRAM},}})\*')


_WORDS = re.compile(r'[^\s"()*]+')


def _query_words(match: str) -> list[str]:
    """The words of an FTS5 query, operators left out: what a hit's score counts."""
    return [w for w in _WORDS.findall(match) if w not in _OPERATORS and w != "NEAR"]


def _score(text: str, terms: Sequence[str]) -> float:
    """How well a segment's text matches the terms, higher is better: each occurrence counts, a whole
    word (not inside a longer one) twice and in the same case three times, over the text's length (a
    short segment that says it is a better hit than a long one that mentions it)."""
    folded = _fold(text)
    total = 0.0
    for term in terms:
        needle = _fold(term)
        at = folded.find(needle) if needle else -1
        while at >= 0:
            end = at + len(needle)
            whole = (at == 0 or not folded[at - 1].isalnum()) and (
                end == len(folded) or not folded[end].isalnum()
            )
            total += 1.0 + (1.0 if whole else 0.0) + (1.0 if text[at:end] == term else 0.0)
            at = folded.find(needle, at + 1)
    return round(total / (1.0 + len(text) / 200.0), 4)


def _failed(q: str, error: sqlite3.Error) -> LibraryError:
    """The error to raise for an SQLite error while searching: the query's fault (SearchError) unless
    the database was busy or broken."""
    reason = one_line(error).removeprefix("fts5: ")
    if not isinstance(error, sqlite3.OperationalError) or "locked" in reason or "busy" in reason:
        return LibraryError(f"search {_shown(q)} failed: {reason}")
    return SearchError(f"invalid search {_shown(q)}: {reason} (FTS5 query syntax)")


def _page(limit: int, offset: int) -> tuple[int, int]:
    """The page asked for, at most MAX_HITS hits long."""
    return min(MAX_HITS, max(0, int(limit))), max(0, int(offset))


def _index_part(
    conn: sqlite3.Connection, plan: _Plan, conditions: list[str], params: list[Any], transcript_id: str | None
) -> tuple[str, list[Any]] | None:
    """The FROM and WHERE clauses (and their parameters) of the segments an index query matches, with
    the filters; None when the transcript has no segments. One transcript's segments were inserted
    together, so their keys span a short range that the index reads alone."""
    where = ["segments_fts MATCH ?"]
    args: list[Any] = [plan.match]
    if transcript_id is not None:
        lo, hi = conn.execute(
            "SELECT min(key), max(key) FROM segments WHERE transcript_id = ?", (transcript_id,)
        ).fetchone()
        if lo is None:
            return None
        where.append("segments_fts.rowid BETWEEN ? AND ?")
        args += [lo, hi]
    join = ""
    if conditions:
        join = " JOIN segments s ON s.key = segments_fts.rowid"
        where += conditions
        args += params
    return f" FROM segments_fts{join} WHERE " + " AND ".join(where), args


def search(
    library: Library, q: str, limit: int = 20, offset: int = 0, *, transcript_id: str | None = None
) -> list[dict[str, Any]]:
    """The segments that match q: {"transcript_id", "title", "segment_id", "start", "end", "text",
    "snippet" (HTML: the text around the hit, the hit in <mark>...</mark>, the rest escaped), "score"
    (higher is better, see _score; 0 where unranked)}. transcript_id: only that one's.

    Best first when the query matches at most RANKED_HITS segments; beyond that, and for hits
    found by scanning alone, the most recently added first (ranking hundreds of thousands of hits of a
    common word would take seconds on a large library, and a single column's bm25 says little about
    them). Raises SearchError for an empty or invalid query (see the module's docstring for the syntax).
    """
    plan = _plan(q)
    limit, offset = _page(limit, offset)
    conditions, params = _filters(plan, transcript_id)
    with library.reading() as conn:
        try:
            if plan.match is None:
                rows = conn.execute(
                    "SELECT s.key, 0.0 FROM segments s WHERE "
                    + " AND ".join(conditions)
                    + " ORDER BY s.key DESC LIMIT ? OFFSET ?",
                    (*params, limit, offset),
                ).fetchall()
            else:
                part = _index_part(conn, plan, conditions, params, transcript_id)
                if part is None:
                    return []
                sql, args = part
                # The newest RANKED_HITS + 1 matches: walking the index in key order stops there, however
                # common the words (FTS5's bm25 would read every term's whole hit list).
                found = _rarest_term_hits(conn, plan) if transcript_id is None else None
                probe = (
                    found
                    if found is not None
                    else [
                        r[0]
                        for r in conn.execute(
                            "SELECT segments_fts.rowid" + sql + " ORDER BY segments_fts.rowid DESC LIMIT ?",
                            (*args, RANKED_HITS + 1),
                        )
                    ]
                )
                if len(probe) <= RANKED_HITS:
                    needles = plan.terms if plan.terms is not None else _query_words(plan.match)
                    texts = _texts(conn, probe)
                    if found is not None:  # the rarest term's hits: those that hold every term
                        folded = [_fold(t) for t in plan.terms or ()]
                        texts = {k: t for k, t in texts.items() if all(f in _fold(t) for f in folded)}
                    scored = sorted(((_score(t, needles), k) for k, t in texts.items()), reverse=True)
                    rows = [(key, score) for score, key in scored[offset : offset + limit]]
                elif offset + limit <= len(probe):
                    rows = [(key, 0.0) for key in probe[offset : offset + limit]]
                else:
                    rows = conn.execute(
                        "SELECT segments_fts.rowid, 0.0"
                        + sql
                        + " ORDER BY segments_fts.rowid DESC LIMIT ? OFFSET ?",
                        (*args, limit, offset),
                    ).fetchall()
            if not rows:
                return []
            keys = [row[0] for row in rows]
            details = {
                row[0]: row[1:]
                for row in conn.execute(
                    'SELECT s.key, s.transcript_id, t.title, s.segment_id, s.start, s."end", s.text'
                    " FROM segments s JOIN transcripts t ON t.id = s.transcript_id WHERE s.key IN ("
                    + ", ".join("?" * len(keys))
                    + ")",
                    keys,
                )
            }
        except sqlite3.Error as e:
            raise _failed(q, e) from None
    hits = []
    for key, score in rows:
        if key not in details:
            continue
        tid, title, segment_id, start, end, text = details[key]
        # FTS5's highlight() would evaluate the query again for every hit: the words are marked here.
        shown = _mark_terms(text, plan.terms if plan.terms is not None else _query_words(plan.match or ""))
        hits.append(
            {
                "transcript_id": tid,
                "title": title,
                "segment_id": segment_id,
                "start": start,
                "end": end,
                "text": text,
                "snippet": _snippet(
                    shown if shown is not None else text.replace(_OPEN, "").replace(_CLOSE, "")
                ),
                "score": float(score),
            }
        )
    return hits


def count(library: Library, q: str, *, transcript_id: str | None = None) -> int:
    """The number of segments that match q (as search finds them). Raises SearchError as search does."""
    plan = _plan(q)
    conditions, params = _filters(plan, transcript_id)
    with library.reading() as conn:
        try:
            if plan.match is None:
                sql = "SELECT count(*) FROM segments s WHERE " + " AND ".join(conditions)
                return int(conn.execute(sql, params).fetchone()[0])
            part = _index_part(conn, plan, conditions, params, transcript_id)
            if part is None:
                return 0
            return int(conn.execute("SELECT count(*)" + part[0], part[1]).fetchone()[0])
        except sqlite3.Error as e:
            raise _failed(q, e) from None
