"""Per-row token counts made by a Compressor's tokenizer, and the view's cut of a row over a message
budget beside its count (migration 0021): derived data a replica that never saw a session reads
instead of encoding the rows again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from palimpsest.store.db import Connection
from palimpsest.store.repository.access import rows_affected
from palimpsest.v1 import common_pb2

CUT_FIELDS = ("head_tokens", "tail_tokens", "head_chars", "tail_chars", "tokens")


def cut_json(digest: str, count: common_pb2.TokenCount) -> str | None:
    """A count's cut as the token_cut column keeps it (None: the count carries none)."""
    if not count.HasField("cut"):
        return None
    cut = count.cut
    return json.dumps({"digest": digest, "md5": cut.content_md5, **{f: getattr(cut, f) for f in CUT_FIELDS}})


def cut_from_json(stored: str | dict | None, digest: str) -> common_pb2.CutCount | None:
    """A stored cut, when the tokenizer ``digest`` made it (another model's cut is not this one's)."""
    if stored is None:
        return None
    value = json.loads(stored) if isinstance(stored, str) else stored
    if value.get("digest") != digest:
        return None
    return common_pb2.CutCount(content_md5=value.get("md5", ""), **{f: int(value.get(f, 0)) for f in CUT_FIELDS})


async def write_token_counts(
    conn: Connection, session_id: uuid.UUID, token_digest: str, counts: Sequence[common_pb2.TokenCount]
) -> int:
    """Counts onto the rows whose content they were made from; the archive is looked at only for
    counts the hot table did not take (new counts are of recent rows, and the archive is the big one).
    A count without a cut leaves the row's stored cut as it is (it is tied to its own digest)."""
    updated = 0
    for table in ("session_messages", "session_messages_archive"):
        status = await conn.execute(
            f"""
            UPDATE {table} m SET token_count = c.tokens, token_digest = $2,
                                 token_cut = coalesce(c.cut::jsonb, m.token_cut)
              FROM unnest($3::bigint[], $4::int[], $5::text[], $6::text[]) AS c(seq, tokens, md5, cut)
             WHERE m.session_id = $1 AND m.seq = c.seq AND md5(m.content) = c.md5
            """,
            session_id,
            token_digest,
            [c.seq for c in counts],
            [c.tokens for c in counts],
            [c.content_md5 for c in counts],
            [cut_json(token_digest, c) for c in counts],
        )
        updated += rows_affected(status)
        if updated == len(counts):
            break
    return updated
