"""Which sessions a ListSessions query matches, and how well (the store side of session_search).

A session matches when its name or a displayed message holds the whole query (an id, a path, a
phrase), or, for a query of several words, when it holds at least two of the query's distinct
words anywhere in its name and messages (function words left out; one when only one is left:
"OOM worker" finds "the OOM bug in the default worker pool"), or, when the semantic tier
answers, when one of its messages or summaries is near the query in meaning. Its relevance adds
the three as memory search does (repository.memory): 1 for the whole query, the share of the
query's words it holds (0–1), and the meaning score (0–1, the cosine rescaled from the floor).

Every arm is its own SELECT on one table with one ILIKE pattern, so each uses its trigram index
(migration 0009, or the every-start script when pg_trgm came later).
"""

from __future__ import annotations

import re
from typing import Any

from palimpsest.store.repository.access import like_pattern
from palimpsest.store.repository.vectors import SESSIONS_NEAR_SQL

# A longer query is a sentence; its first words carry what it is about, and each word is three
# index scans.
MAX_WORDS = 8
# A session holding this many of a query's distinct words matches without holding the query whole.
MIN_WORD_HITS = 2
_WORD = re.compile(r"[\w./:-]+")
# Words that are in nearly every session: matching on them would make any two-word query match
# everything (and scan every message).
_FUNCTION_WORDS = frozenset(
    "a an and are as at be but by can did do does for from had has have how i if in is it its "
    "me my no not of on or our so that the their then there these this to was we were what when "
    "where which who why will with you your".split()
)


def query_words(query: str) -> list[str]:
    """The query's distinct words a session is matched on, in query order: two characters or more,
    no function words, at most MAX_WORDS."""
    words: list[str] = []
    for raw in _WORD.findall(query.casefold()):
        word = raw.strip("./:-")
        if len(word) >= 2 and word not in _FUNCTION_WORDS and word not in words:
            words.append(word)
    return words[:MAX_WORDS]


def matching_words(query: str) -> list[str]:
    """The words matched one by one: none when the query is one word (the whole query is it)."""
    words = query_words(query)
    return [] if words == [query.strip().casefold()] else words


def words_needed(words: list[str]) -> int:
    """How many distinct words a session must hold: two, or the one a query has besides its
    function words ("the browser in")."""
    return min(MIN_WORD_HITS, len(words))


def _arms(pattern: str, mark: int) -> list[str]:
    """Sessions whose name or displayed messages match `pattern` ($n), tagged with `mark`."""
    shown = f"is_display AND content ILIKE {pattern}"
    return [
        f"SELECT id AS session_id, {mark} AS word FROM sessions WHERE name ILIKE {pattern}",
        f"SELECT session_id, {mark} FROM session_messages WHERE {shown}",
        f"SELECT session_id, {mark} FROM session_messages_archive WHERE {shown}",
    ]


def matched_sql(query: str, params: list[Any], meaning: tuple[str, str, int, float] | None) -> tuple[str, str]:
    """A FROM item `matched (id, whole, words, similarity)` of the sessions the query matches
    (binding its values onto `params`), and the relevance expression over it.

    ``meaning``: (model, the query's vector, its dimensions, the floor) from
    MemoryIndex.sessions_query, or None (words only)."""
    params.append(like_pattern(query))
    arms = _arms(f"${len(params)}", 0)
    words = matching_words(query)
    for mark, word in enumerate(words, 1):
        params.append(like_pattern(word))
        arms += _arms(f"${len(params)}", mark)
    lexical = (
        "SELECT session_id, bool_or(word = 0) AS whole,"
        " count(DISTINCT word) FILTER (WHERE word > 0) AS words, NULL::float8 AS similarity"
        f" FROM ({' UNION '.join(arms)}) hits GROUP BY session_id"
    )
    parts = [lexical]
    meaning_score = "0"
    if meaning is not None:
        params.extend(meaning)
        m, v, d, f = (f"${len(params) - i}" for i in (3, 2, 1, 0))
        near = SESSIONS_NEAR_SQL.format(m=m, v=v, d=d, f=f)
        parts.append(f"SELECT session_id, false, 0, similarity FROM ({near}) n")
        # 0 at the floor (unrelated texts reach it), 1 for the same meaning; see meaning_scores.
        meaning_score = f"coalesce((matched.similarity - {f}) / greatest(1 - {f}, 1e-9), 0)"
    source = (
        "(SELECT session_id AS id, bool_or(whole) AS whole, max(words) AS words,"
        f" max(similarity) AS similarity FROM ({' UNION ALL '.join(parts)}) found"
        " GROUP BY session_id"
        f" HAVING bool_or(whole) OR max(words) >= {max(words_needed(words), 1)}"
        " OR max(similarity) IS NOT NULL) matched"
    )
    # The share of the query's words held; a query of one word is held whole or not at all.
    coverage = f"matched.words::float8 / {len(words)}" if words else "0"
    relevance = f"(CASE WHEN matched.whole THEN 1 ELSE 0 END + {coverage} + {meaning_score})"
    return source, relevance


def snippet_around(content: str, query: str, radius: int = 60) -> str:
    """The text around the query in `content`, else around the first of its words found."""
    lowered = content.lower()
    found = [(lowered.find(needle), needle) for needle in [query.lower(), *matching_words(query)]]
    at, needle = next(((i, n) for i, n in found if i >= 0), (-1, ""))
    if at < 0:
        return content[: radius * 2]
    start, end = max(0, at - radius), min(len(content), at + len(needle) + radius)
    return ("…" if start else "") + content[start:end] + ("…" if end < len(content) else "")
