-- The store's SQL functions, each as it is now: the one place their text lives. The migration runner
-- (db.migrate) applies this file after the numbered migrations, under the migrations' advisory lock,
-- whenever its text differs from the one last applied (schema_functions holds that text's digest),
-- so an edit here reaches every database on the next start of a store. The migrations that made
-- them first (0013 to 0017) stay as they ran: they are history, and a database is migrated by them
-- before this file replaces what they left.
--
-- Editing a function: change it here. CREATE OR REPLACE keeps the arguments' names and types and the
-- result: a change to those is a new overload (the old one stays for the replicas of the release
-- before, during a rolling update) and dropping the old one is a numbered migration. A store older
-- than the database's migrations does not apply its copy of this file (db.migrate), so a replica of
-- the release before that restarts during an update does not put an older text back.

-- append_messages: an append in one round trip. Between a model's last token and the client's
-- stream_end the Agent stores the answer with its call's report; as the ten or so statements of a
-- transaction that was ten round trips before the commit. This function does the same work in one
-- statement, so a caller in autocommit pays one round trip and the commit.
--
-- It checks before it writes (access, idempotency key, revision, quota) and, when a check fails,
-- returns a status with what the caller needs to word the error, having written nothing. Moving
-- rows past the hot window to the archive is left to the caller, in a transaction of its own (an
-- archive move changes no revision and no answer).
--
-- p_owner: the caller's subject when it may write only its own sessions; NULL when it may write any
--   (auth off, admins, the services).
-- p_expected_revision / p_expected_next_seq: the revision and next seq the writer read; a revision
--   that moved without new messages is no conflict (the append goes ahead and `changed` tells the
--   writer to read the session's other fields again); another writer's messages refuse it ('stale').
-- p_quota_owner / p_quota_left: the owner whose stored bytes the caller looked up and how many it
--   may still add; NULL: no quota applies. A session of another owner returns 'quota_owner' with
--   that owner, and the caller asks again with that owner's allowance.
-- p_rows: the messages, every column but session_id and seq (set here, from the session's next_seq).
-- p_report: the report of the model call the append answers (NULL: none), as JSON:
--   prompt_cut, baseline {tokens, through_seq, model}, observation (a calibration_observations row
--   without id), context_token_count, token_digest, token_counts [[seq, tokens, content md5], ...].
-- p_tool_runs: the tool runs for the session's audit log (a JSON array of tool_runs rows without
--   session_id and seq; NULL: none). A run whose call is stored (call_seq) takes its arguments from
--   that row, already redacted; the log keeps at most 8,000 characters of them. An append of tool
--   runs alone (no rows) writes only them: no revision, counter or activity moves.
CREATE OR REPLACE FUNCTION append_messages(
    p_session uuid, p_owner text, p_expected_revision bigint, p_expected_next_seq bigint,
    p_rows session_messages[], p_now timestamptz, p_preview text, p_key text, p_key_days integer,
    p_quota_owner text, p_quota_left bigint, p_adding bigint, p_report jsonb, p_tool_runs jsonb
) RETURNS TABLE (status text, owner text, revision bigint, seqs bigint[], hot_count integer,
                 hot_bytes bigint, truncated boolean, changed boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s record;
    n integer := coalesce(array_length(p_rows, 1), 0);
    v_seqs bigint[];
    v_revision bigint;
    v_hot_count integer;
    v_hot_bytes bigint;
    v_truncated boolean := false;
    c record;
BEGIN
    SELECT x.owner, x.revision, x.next_seq INTO s FROM sessions x WHERE x.id = p_session FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', NULL::text, NULL::bigint, NULL::bigint[], NULL::integer, NULL::bigint,
                            NULL::boolean, NULL::boolean;
        RETURN;
    END IF;
    IF p_owner IS NOT NULL AND coalesce(s.owner, '') <> p_owner THEN
        RETURN QUERY SELECT 'forbidden', s.owner, s.revision, NULL::bigint[], NULL::integer, NULL::bigint,
                            NULL::boolean, NULL::boolean;
        RETURN;
    END IF;
    -- The key before the revision: the first attempt moved the revision, and its retry must get
    -- that attempt's answer, not a conflict.
    IF p_key <> '' THEN
        SELECT a.seqs, a.revision INTO v_seqs, v_revision FROM applied_appends a
         WHERE a.session_id = p_session AND a.key = p_key;
        IF FOUND THEN
            -- A retry's answer: what changed since is unknown here, so the writer is told to look.
            RETURN QUERY SELECT 'replayed', s.owner, v_revision, v_seqs, NULL::integer, NULL::bigint, false, true;
            RETURN;
        END IF;
    END IF;
    IF p_expected_revision IS NOT NULL AND s.revision <> p_expected_revision
            AND (p_expected_next_seq IS NULL OR s.next_seq <> p_expected_next_seq) THEN
        RETURN QUERY SELECT 'stale', s.owner, s.revision, NULL::bigint[], NULL::integer, NULL::bigint, NULL::boolean,
                            NULL::boolean;
        RETURN;
    END IF;
    IF p_quota_owner IS NOT NULL AND coalesce(s.owner, '') <> '' AND p_adding > 0 THEN
        IF s.owner <> p_quota_owner OR p_adding > p_quota_left THEN
            RETURN QUERY SELECT CASE WHEN s.owner <> p_quota_owner THEN 'quota_owner' ELSE 'quota' END,
                                s.owner, s.revision, NULL::bigint[], NULL::integer, NULL::bigint, NULL::boolean,
                                NULL::boolean;
            RETURN;
        END IF;
    END IF;

    IF n > 0 THEN
        v_seqs := ARRAY(SELECT s.next_seq + i - 1 FROM generate_series(1, n) i);
        INSERT INTO session_messages (
            session_id, seq, role, content, thinking, tool_calls, tool_call_id, name, images, files, metadata,
            is_context, is_display, is_plan, is_compression, is_summary, is_compression_critical, is_recall,
            elapsed_seconds, tool_call_count, token_count, created_at, breadcrumbs, replaces_first, replaces_last)
        SELECT p_session, s.next_seq + r.ordinality - 1, r.role, r.content, r.thinking, r.tool_calls, r.tool_call_id, r.name,
               r.images, r.files, r.metadata, r.is_context, r.is_display, r.is_plan, r.is_compression, r.is_summary,
               r.is_compression_critical, r.is_recall, r.elapsed_seconds, r.tool_call_count, r.token_count,
               r.created_at, r.breadcrumbs, r.replaces_first, r.replaces_last
          FROM unnest(p_rows) WITH ORDINALITY AS r;

        -- The counters over the new rows only, weighed from the rows as given (what was just inserted,
        -- without reading it back); a row weighs what the store's ROW_BYTES says.
        WITH added AS (
            SELECT coalesce(sum(octet_length(m.content) + octet_length(m.thinking) + octet_length(m.tool_calls::text)
                                + coalesce((SELECT sum(octet_length(i)) FROM unnest(m.images) i), 0)), 0) AS bytes,
                   count(*) FILTER (WHERE m.is_display) AS displayed
              FROM unnest(p_rows) m
        )
        UPDATE sessions x SET revision = x.revision + 1, next_seq = s.next_seq + n, last_active = p_now,
               display_count = x.display_count + added.displayed, hot_count = x.hot_count + n,
               hot_bytes = x.hot_bytes + added.bytes, message_bytes = x.message_bytes + added.bytes,
               preview = CASE WHEN x.preview = '' THEN p_preview ELSE x.preview END,
               context_token_count = coalesce((p_report ->> 'context_token_count')::bigint, x.context_token_count)
          FROM added WHERE x.id = p_session
        RETURNING x.revision, x.hot_count, x.hot_bytes INTO v_revision, v_hot_count, v_hot_bytes;
    ELSE  -- tool runs alone: the session itself does not change
        v_seqs := '{}';
        v_revision := s.revision;
        v_hot_count := 0;
        v_hot_bytes := 0;
    END IF;

    IF p_report IS NOT NULL THEN
        -- A proven cut only sets the flag (a session may be flagged before it had an honest baseline:
        -- tokens 0 = none); a baseline keeps a flag no compression has consumed yet.
        IF coalesce((p_report ->> 'prompt_cut')::boolean, false) THEN
            INSERT INTO session_baselines (session_id, tokens, through_seq, context_truncated)
            VALUES (p_session, 0, 0, true)
            ON CONFLICT (session_id) DO UPDATE SET context_truncated = true
            RETURNING session_baselines.context_truncated INTO v_truncated;
        ELSIF p_report ? 'baseline' THEN
            INSERT INTO session_baselines (session_id, tokens, through_seq, model, context_truncated)
            VALUES (p_session, (p_report #>> '{baseline,tokens}')::bigint,
                    (p_report #>> '{baseline,through_seq}')::bigint, p_report #>> '{baseline,model}', false)
            ON CONFLICT (session_id) DO UPDATE SET tokens = excluded.tokens, through_seq = excluded.through_seq,
                model = excluded.model, recorded_at = now()
            RETURNING session_baselines.context_truncated INTO v_truncated;
        ELSE
            SELECT coalesce(b.context_truncated, false) INTO v_truncated
              FROM session_baselines b WHERE b.session_id = p_session;
        END IF;
        IF p_report ? 'observation' THEN
            -- In FROM, so the record is made once: `(jsonb_populate_record(…)).*` in the select list
            -- ran it (and nextval) once per column of the table.
            INSERT INTO calibration_observations
            SELECT o.* FROM jsonb_populate_record(NULL::calibration_observations, p_report -> 'observation'
                    || jsonb_build_object('id', nextval('calibration_observations_id_seq'), 'observed_at', p_now)) o;
        END IF;
        -- Exact counts onto the rows whose content they were made from, one index lookup each:
        -- they are of recent rows, so the archive is looked at only for a count the hot table
        -- did not take (a join over the session's rows read its whole archive: O(history)).
        FOR c IN SELECT (e ->> 0)::bigint AS seq, (e ->> 1)::integer AS tokens, e ->> 2 AS md5
                   FROM jsonb_array_elements(coalesce(p_report -> 'token_counts', '[]')) e LOOP
            UPDATE session_messages m SET token_count = c.tokens, token_digest = p_report ->> 'token_digest'
             WHERE m.session_id = p_session AND m.seq = c.seq AND md5(m.content) = c.md5;
            IF NOT FOUND THEN
                UPDATE session_messages_archive m SET token_count = c.tokens, token_digest = p_report ->> 'token_digest'
                 WHERE m.session_id = p_session AND m.seq = c.seq AND md5(m.content) = c.md5;
            END IF;
        END LOOP;
    END IF;

    IF p_tool_runs IS NOT NULL THEN
        -- Numbered after the session's last run: the session's row is locked, so two appends
        -- never take the same numbers.
        INSERT INTO tool_runs (session_id, seq, turn_id, call_id, is_subagent, tool, arguments, call_seq, started_at,
                               duration_seconds, outcome, bytes_in, bytes_out, error)
        SELECT p_session,
               coalesce((SELECT max(t.seq) FROM tool_runs t WHERE t.session_id = p_session), 0) + e.ordinality,
               e.run ->> 'turn_id', e.run ->> 'call_id', (e.run ->> 'is_subagent')::boolean, e.run ->> 'tool',
               CASE WHEN length(a.arguments) > 8000 THEN left(a.arguments, 7999) || '…' ELSE a.arguments END,
               (e.run ->> 'call_seq')::bigint, (e.run ->> 'started_at')::timestamptz,
               (e.run ->> 'duration_seconds')::double precision, e.run ->> 'outcome',
               (e.run ->> 'bytes_in')::bigint, (e.run ->> 'bytes_out')::bigint, e.run ->> 'error'
          FROM jsonb_array_elements(p_tool_runs) WITH ORDINALITY AS e(run, ordinality)
         CROSS JOIN LATERAL (
               -- A stored call's arguments from its row (one primary-key lookup; the turn's own rows
               -- are hot), else as sent.
               SELECT CASE WHEN (e.run ->> 'call_seq')::bigint > 0 THEN coalesce((
                          SELECT c ->> 'arguments' FROM session_messages m, jsonb_array_elements(m.tool_calls) c
                           WHERE m.session_id = p_session AND m.seq = (e.run ->> 'call_seq')::bigint
                             AND c ->> 'id' = e.run ->> 'call_id' LIMIT 1), '')
                      ELSE e.run ->> 'arguments' END AS arguments) a;
    END IF;

    IF p_key <> '' THEN
        DELETE FROM applied_appends a
         WHERE a.session_id = p_session AND a.applied_at < p_now - make_interval(days => p_key_days);
        INSERT INTO applied_appends (session_id, key, seqs, revision, applied_at)
        VALUES (p_session, p_key, v_seqs, v_revision, p_now);
    END IF;
    RETURN QUERY SELECT 'ok'::text, s.owner, v_revision, v_seqs, v_hot_count, v_hot_bytes, v_truncated,
                        p_expected_revision IS NOT NULL AND s.revision <> p_expected_revision;
END
$$;
