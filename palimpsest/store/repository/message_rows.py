"""SQL fragments over a session's message rows (session_messages and its archive) that more than
one part of the repository reads: what a row weighs, and the two tables read as one history."""

from __future__ import annotations

from palimpsest.store.convert import MESSAGE_COLUMNS

# What a row weighs against the hot window's byte cap: one definition, in SQL, for every counter
# (the append function in functions.sql spells it once more; a test holds the two together).
ROW_BYTES = (
    "(octet_length(content) + octet_length(thinking) + octet_length(tool_calls::text)"
    " + coalesce((SELECT sum(octet_length(i)) FROM unnest(images) i), 0))"
)


def new_rows_bytes(first_seq_param: str) -> str:
    """SQL for the bytes of a session's rows from seq `first_seq_param` on: O(new rows), inside the
    statement that updates the counters (no round trip of its own)."""
    return (
        f"(SELECT coalesce(sum({ROW_BYTES}), 0) FROM session_messages"
        f" WHERE session_id = $1 AND seq >= {first_seq_param})"
    )


# Hot and archived rows read as one history; `archived` tells them apart.
BOTH_TABLES = f"""
    SELECT {MESSAGE_COLUMNS}, false AS archived FROM session_messages WHERE session_id = $1 AND {{where}}
    UNION ALL
    SELECT {MESSAGE_COLUMNS}, true AS archived FROM session_messages_archive WHERE session_id = $1 AND {{where}}
"""
