-- cowproxy copy-on-write layer: cow.commit_session and its code helpers.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- "EXISTS (SELECT 1 FROM child r WHERE r.fk = b.key) OR ...": some base row references row `b` of p_rel through a
-- foreign key (of any table, enabled or not); "false" when no foreign key references p_rel.
CREATE OR REPLACE FUNCTION cow._referenced_code(p_rel oid, b text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(string_agg(format('EXISTS (SELECT 1 FROM %I.%I r WHERE %s)', n.nspname, c.relname,
                                      cow._eq2(cow._attnames(k.conrelid, k.conkey), 'r',
                                               cow._attnames(k.confrelid, k.confkey), b)),
                               ' OR ' ORDER BY k.oid), 'false')
    FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE k.contype = 'f' AND k.confrelid = p_rel AND k.conparentid = 0
$$;

-- "(SELECT DISTINCT ON (key) c.* FROM <changes> c WHERE c._cow_session = $1 AND <ops $2> ORDER BY key, seq DESC)":
-- the last write per key of the session (of operations $2, all when NULL), as cow.commit_session reads it.
CREATE OR REPLACE FUNCTION cow._latest_code(p_changes text, p_pk text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('(SELECT DISTINCT ON (%s) c.* FROM cow_changes.%I c WHERE c._cow_session = $1 '
                  'AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) ORDER BY %s, c._cow_seq DESC)',
                  cow._collist(p_pk, 'c.'), p_changes, cow._collist(p_pk, 'c.'))
$$;

-- The statement cow.commit_session applies a table's kept rows with: the updates of rows the base has, then
-- the inserts of the others, in one statement (PostgreSQL checks foreign keys at the end of a statement, so an
-- updated row may reference a row inserted here, e.g. in a self-referencing table, and the other way round;
-- the INSERT reads u's count first, so the updates, which may free UNIQUE values, run first). p_sel: the rows
-- (cow._latest_code, or a subset of it); returns (updated, inserted).
CREATE OR REPLACE FUNCTION cow._apply_code(p_rel oid, ncols text[], setcols text[], has_always boolean, pk text[],
                                           p_sel text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT format('WITH u AS (%s), i AS (INSERT INTO %s (%s) %s SELECT %s FROM %s c WHERE NOT c._cow_deleted '
                  'AND (SELECT count(*) FROM u) >= 0 '
                  'AND NOT EXISTS (SELECT 1 FROM %s b WHERE %s) ORDER BY c._cow_seq RETURNING 1) '
                  'SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM i)',
                  CASE WHEN setcols IS NULL THEN 'SELECT 1 WHERE false'
                       ELSE format('UPDATE %s b SET (%s) = ROW(%s) FROM %s c WHERE NOT c._cow_deleted AND %s RETURNING 1',
                                   p_rel::regclass, cow._collist(setcols), cow._collist(setcols, 'c.'),
                                   p_sel, cow._eq(pk, 'b', 'c')) END,
                  p_rel::regclass, cow._collist(ncols),
                  CASE WHEN has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END, cow._collist(ncols, 'c.'),
                  p_sel, p_rel::regclass, cow._eq(pk, 'b', 'c'))
$$;

-- Apply the session's net changes (or those of some operations and what they depend on) to the base tables,
-- in one transaction: deletes children first, then inserts/updates parents first. A base row changed since
-- the session first wrote it is a conflict (40001) unless on_conflict = 'overwrite'.
CREATE OR REPLACE FUNCTION cow.commit_session(session text, ops text[] DEFAULT NULL, on_conflict text DEFAULT 'fail')
RETURNS jsonb
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    srow cow.sessions;
    prev text := current_setting('cow.session_id', true);
    chosen text[];
    ord int[];
    g cow.registry%ROWTYPE;
    i int;
    sel text;
    pkeq text;
    ncols text[];
    setcols text[];
    mcols text[];
    movecols text[];
    moved bigint;
    m bigint;
    has_always boolean;
    bad text;
    n bigint;
    remaining bigint := 0;
    summary jsonb := '{}';
    stats jsonb;
    refs text;
    nullset text;
    row_id tid;
    row_key jsonb;
    ckey text;
    stmt text;
    held boolean := false;  -- an update of the first pass could not run: a delete may be held back
    pending jsonb := '{}';  -- per table (position in ord): keys whose write waits for the held-back deletes
    keys jsonb[];
    rest jsonb[];
    k1 bigint;
    k2 bigint;
    progress boolean;
BEGIN
    PERFORM cow._refuse_bound('commit_session');
    IF on_conflict IS NULL OR on_conflict NOT IN ('fail', 'overwrite') THEN
        RAISE EXCEPTION 'on_conflict must be fail or overwrite' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    srow := cow._session_row(session, true);
    IF srow.status <> 'open' THEN
        RAISE EXCEPTION 'session % is %', session, srow.status USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF ops IS NOT NULL THEN
        chosen := cow.operation_closure(session, ops);
    END IF;
    -- The base tables refuse writes while a session is set; this function is the one sanctioned writer.
    PERFORM set_config('cow.session_id', '', true);
    ord := cow._table_order();
    -- Conflicts first, so that nothing is written when one exists.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns = '{}';  -- keyless (35_keyless.sql): cow._kl_commit below
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        pkeq := cow._eq(g.pk_columns, 'b', 'c');
        IF on_conflict = 'fail' THEN
            EXECUTE format('SELECT format(''(%s)=(%%s)'', %s) FROM %s c LEFT JOIN %I.%I b ON %s '
                           'WHERE (CASE WHEN b.%I IS NULL THEN NULL ELSE to_jsonb(b.*) END) IS DISTINCT FROM c._cow_base LIMIT 1',
                           cow._collist(g.pk_columns), cow._keytext(g.pk_columns, 'c'), sel, g.table_schema, g.table_name,
                           pkeq, g.pk_columns[1])
            INTO bad USING session, chosen;
            IF bad IS NOT NULL THEN
                RAISE EXCEPTION 'could not commit session %: row % of table %.% changed in base since the session first wrote it',
                    session, bad, quote_ident(g.table_schema), quote_ident(g.table_name)
                    USING ERRCODE = 'serialization_failure',
                          HINT = 'discard the session, or commit with on_conflict => ''overwrite'' (--on-conflict overwrite)';
            END IF;
        END IF;
    END LOOP;
    -- Updates that drop a reference to a row the session deleted (re-pointed or nulled by the session, by hand
    -- or by its ON DELETE SET NULL), parents first, before the deletes: so the base's ON DELETE action does
    -- not fire on them and the deleted row's UNIQUE values are free for the inserts below. Row by row: an
    -- update that cannot run yet (it references a row this commit inserts later) nulls the dropped reference
    -- instead, the updates below set the final values; when neither can run, the delete that the reference
    -- holds waits for those updates (the check in the delete passes).
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns = '{}';  -- keyless (35_keyless.sql): cow._kl_commit below
        -- (a key the session moved away from is not deleted: the move is applied as an UPDATE, references follow)
        WITH f AS (
            SELECT k.oid, cow._attnames(k.conrelid, k.conkey) AS cols,
                   format('EXISTS (SELECT 1 FROM %1$I.%2$I pb JOIN %3$s d ON %4$s WHERE d._cow_deleted AND %5$s '
                          'AND NOT EXISTS (SELECT 1 FROM %3$s m WHERE NOT m._cow_deleted '
                          'AND m._cow_origin = jsonb_build_object(%6$s)))',
                          pr.table_schema, pr.table_name, cow._latest_code(pr.changes_table, pr.pk_columns),
                          cow._eq(pr.pk_columns, 'pb', 'd'),
                          cow._eq2(cow._attnames(k.confrelid, k.confkey), 'pb', cow._attnames(k.conrelid, k.conkey), 'b'),
                          cow._jsonargs(pr.pk_columns, 'd')) AS cond
            FROM pg_constraint k JOIN cow.registry pr ON pr.relid = k.confrelid
            WHERE k.contype = 'f' AND k.conrelid = g.relid AND k.conparentid = 0)
        SELECT (SELECT string_agg(f.cond, ' OR ' ORDER BY f.oid) FROM f),
               (SELECT string_agg(format('%I = CASE WHEN %s THEN NULL ELSE b.%I END', x.col, x.conds, x.col), ', ')
                FROM (SELECT col, string_agg(f.cond, ' OR ' ORDER BY f.oid) AS conds
                      FROM f, unnest(f.cols) AS col WHERE NOT col = ANY (g.pk_columns) GROUP BY col) x)
        INTO refs, nullset;
        SELECT array_agg(a.attname::text ORDER BY a.attnum) INTO setcols FROM pg_attribute a
        WHERE a.attrelid = g.relid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
          AND a.attidentity <> 'a' AND NOT a.attname = ANY (g.pk_columns);
        CONTINUE WHEN refs IS NULL OR setcols IS NULL;
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        ckey := format('jsonb_build_object(%s)', cow._jsonargs(g.pk_columns, 'c'));
        -- The base row of each kept session row: at its key, or at its origin when the session moved it.
        FOR row_id, row_key IN EXECUTE format(
                'SELECT b.ctid, %4$s FROM %1$I.%2$I b JOIN %3$s c ON %5$s WHERE NOT c._cow_deleted '
                'AND coalesce(c._cow_origin = %4$s, true) AND (%6$s) '
                'UNION ALL SELECT b.ctid, %4$s FROM %1$I.%2$I b JOIN %3$s c ON c._cow_origin = jsonb_build_object(%7$s) '
                'WHERE NOT c._cow_deleted AND c._cow_origin <> %4$s AND (%6$s)',
                g.table_schema, g.table_name, sel, ckey, cow._eq(g.pk_columns, 'b', 'c'), refs,
                cow._jsonargs(g.pk_columns, 'b'))
            USING session, chosen LOOP
            BEGIN
                EXECUTE format('UPDATE %I.%I b SET (%s) = ROW(%s) FROM %s c WHERE b.ctid = $3 AND %s = $4',
                               g.table_schema, g.table_name, cow._collist(setcols), cow._collist(setcols, 'c.'), sel,
                               ckey)
                USING session, chosen, row_id, row_key;
            EXCEPTION WHEN integrity_constraint_violation THEN
                held := true;
                BEGIN
                    IF nullset IS NOT NULL THEN
                        EXECUTE format('UPDATE %I.%I b SET %s WHERE b.ctid = $3', g.table_schema, g.table_name, nullset)
                        USING session, chosen, row_id;
                    END IF;
                EXCEPTION WHEN integrity_constraint_violation THEN
                    NULL;
                END;
            END;
        END LOOP;
    END LOOP;
    -- Deletes, children first.
    FOR i IN REVERSE coalesce(array_length(ord, 1), 0) .. 1 LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        IF g.pk_columns = '{}' THEN
            -- A keyless table (35_keyless.sql; never referenced: no unique index): its deletes first.
            summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name],
                                 jsonb_build_object('inserted', 0, 'updated', 0,
                                                    'deleted', cow._kl_commit(g, session, chosen, on_conflict, true)));
            CONTINUE;
        END IF;
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        -- Deleted keys, and keys a moved row takes over (the session deleted their base row first). The old
        -- key of a primary-key move is not deleted: the move is applied as an UPDATE below, so that the
        -- base's ON DELETE actions never fire on rows the session did not touch.
        -- A deleted row that a base row still references waits for the last pass: the session re-pointed or
        -- nulled that reference (else its delete would have cascaded or failed in the session), and the base's
        -- ON DELETE action must not fire before the inserts and updates below have applied that.
        EXECUTE format('DELETE FROM %1$I.%2$I b USING %3$s c WHERE %4$s '
                       'AND (c._cow_deleted OR (c._cow_origin IS NOT NULL AND c._cow_origin <> jsonb_build_object(%5$s))) '
                       'AND NOT EXISTS (SELECT 1 FROM %3$s m WHERE NOT m._cow_deleted AND m._cow_origin = jsonb_build_object(%5$s) '
                       'AND m._cow_origin <> jsonb_build_object(%6$s)) '
                       'AND NOT (c._cow_deleted AND coalesce(c._cow_origin = jsonb_build_object(%5$s), true) AND (%7$s))',
                       g.table_schema, g.table_name, sel, cow._eq(g.pk_columns, 'b', 'c'),
                       cow._jsonargs(g.pk_columns, 'c'),
                       cow._jsonargs(g.pk_columns, 'm'),
                       cow._referenced_code(g.relid, 'b'))
        USING session, chosen;
        GET DIAGNOSTICS n = ROW_COUNT;
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name],
                             jsonb_build_object('inserted', 0, 'updated', 0, 'deleted', n));
    END LOOP;
    -- Inserts and updates, parents first, rows in write order.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns = '{}';  -- keyless (35_keyless.sql): cow._kl_commit below
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        pkeq := cow._eq(g.pk_columns, 'b', 'c');
        SELECT array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = ''),
               array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '' AND a.attidentity <> 'a'
                                                                      AND NOT a.attname = ANY (g.pk_columns)),
               array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '' AND a.attidentity <> 'a'),
               bool_or(a.attidentity = 'a')
        INTO ncols, setcols, mcols, has_always
        FROM pg_attribute a WHERE a.attrelid = g.relid AND a.attnum > 0 AND NOT a.attisdropped;
        stats := summary -> (g.table_schema || '.' || g.table_name);
        -- A move sets the key only: the other columns are set with the updates and inserts below, in one
        -- statement, so that a moved row may reference (self-reference) a row the session inserted.
        movecols := CASE WHEN setcols IS NULL OR mcols = setcols THEN mcols
                         ELSE ARRAY(SELECT x FROM unnest(mcols) AS x WHERE NOT x = ANY (setcols)) END;
        -- Primary-key moves: the base row at the key the session first moved is updated in place, in passes,
        -- each moving the rows whose new key is free (a chain 1 -> 5, 2 -> 1 moves 1 first). Moves left over
        -- (keys moving in a cycle) keep their base keys: the updates below set the rows at the target keys.
        moved := 0;
        LOOP
            EXECUTE format('UPDATE %1$I.%2$I b SET (%3$s) = ROW(%4$s) FROM %5$s c WHERE NOT c._cow_deleted '
                           'AND c._cow_origin IS NOT NULL AND c._cow_origin <> jsonb_build_object(%7$s) AND %6$s '
                           'AND NOT EXISTS (SELECT 1 FROM %1$I.%2$I b2 WHERE %8$s)',
                           g.table_schema, g.table_name, cow._collist(movecols), cow._collist(movecols, 'c.'), sel,
                           (SELECT string_agg(format('b.%I = (c._cow_origin ->> %L)::%s', k, k,
                                                     format_type(a.atttypid, a.atttypmod)), ' AND ')
                            FROM unnest(g.pk_columns) AS k JOIN pg_attribute a ON a.attrelid = g.relid AND a.attname = k),
                           cow._jsonargs(g.pk_columns, 'c'),
                           cow._eq(g.pk_columns, 'b2', 'c'))
            USING session, chosen;
            GET DIAGNOSTICS n = ROW_COUNT;
            EXIT WHEN n = 0;
            moved := moved + n;
        END LOOP;
        EXECUTE format('DELETE FROM %I.%I b USING %s c WHERE c._cow_deleted AND %s AND NOT (%s)', g.table_schema,
                       g.table_name, sel, cow._eq(g.pk_columns, 'b', 'c'), cow._referenced_code(g.relid, 'b'))
        USING session, chosen;
        GET DIAGNOSTICS n = ROW_COUNT;
        stats := jsonb_set(stats, '{deleted}', to_jsonb((stats ->> 'deleted')::bigint + n));
        -- Updates, then inserts, in one statement: PostgreSQL checks foreign keys at the end of a statement,
        -- so an updated row may reference a row inserted here (a self-referencing table) and the other way
        -- round. The INSERT reads u's count first, so the updates (which may free UNIQUE values) run first.
        stmt := cow._apply_code(g.relid, ncols, setcols, has_always, g.pk_columns, sel);
        BEGIN
            EXECUTE stmt INTO m, n USING session, chosen;
        EXCEPTION WHEN unique_violation OR foreign_key_violation THEN
            IF NOT held THEN
                RAISE;
            END IF;
            -- A delete is held back (above): its row still holds its UNIQUE values, and rows of later tables
            -- may reference rows that cannot be written yet. Row by row, in passes while some succeed; what
            -- is left is written after the held-back deletes (and raises there if it still cannot).
            ckey := format('jsonb_build_object(%s)', cow._jsonargs(g.pk_columns, 'c'));
            stmt := cow._apply_code(g.relid, ncols, setcols, has_always, g.pk_columns,
                                    format('(SELECT * FROM %s c WHERE %s = ANY ($3))', sel, ckey));
            EXECUTE format('SELECT array_agg(%s ORDER BY c._cow_seq) FROM %s c WHERE NOT c._cow_deleted', ckey, sel)
            INTO keys USING session, chosen;
            m := 0;
            n := 0;
            LOOP
                progress := false;
                rest := '{}';
                FOREACH row_key IN ARRAY coalesce(keys, '{}') LOOP
                    BEGIN
                        EXECUTE stmt INTO k1, k2 USING session, chosen, ARRAY[row_key];
                        m := m + k1;
                        n := n + k2;
                        progress := true;
                    EXCEPTION WHEN unique_violation OR foreign_key_violation THEN
                        rest := rest || row_key;
                    END;
                END LOOP;
                keys := rest;
                EXIT WHEN NOT progress OR cardinality(keys) = 0;
            END LOOP;
            IF cardinality(keys) > 0 THEN
                pending := pending || jsonb_build_object(i::text, to_jsonb(keys));
            END IF;
        END;
        -- moved rows included (without non-key columns, the moves are all the updates)
        stats := jsonb_set(stats, '{updated}', to_jsonb(CASE WHEN setcols IS NULL THEN moved ELSE m END));
        -- Rows the session wrote and that already existed count as updated (the UPDATE above), the rest inserted.
        stats := jsonb_set(stats, '{inserted}', to_jsonb(n));
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name], stats);
    END LOOP;
    -- The deletes held back above, children first: by now no base row the session kept references them.
    FOR i IN REVERSE coalesce(array_length(ord, 1), 0) .. 1 LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns = '{}';  -- keyless (35_keyless.sql): cow._kl_commit below
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        EXECUTE format('DELETE FROM %I.%I b USING %s c WHERE c._cow_deleted AND %s', g.table_schema, g.table_name,
                       sel, cow._eq(g.pk_columns, 'b', 'c'))
        USING session, chosen;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            stats := summary -> (g.table_schema || '.' || g.table_name);
            summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name],
                                 jsonb_set(stats, '{deleted}', to_jsonb((stats ->> 'deleted')::bigint + n)));
        END IF;
    END LOOP;
    -- The writes that waited for them (UNIQUE values of a held-back row reused, or a reference to such a
    -- write), parents first; in one statement per table, so that an error is the table's own.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        CONTINUE WHEN NOT pending ? i::text;
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns = '{}';  -- keyless (35_keyless.sql): cow._kl_commit below
        sel := cow._latest_code(g.changes_table, g.pk_columns);
        ckey := format('jsonb_build_object(%s)', cow._jsonargs(g.pk_columns, 'c'));
        SELECT array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = ''),
               array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '' AND a.attidentity <> 'a'
                                                                      AND NOT a.attname = ANY (g.pk_columns)),
               bool_or(a.attidentity = 'a')
        INTO ncols, setcols, has_always
        FROM pg_attribute a WHERE a.attrelid = g.relid AND a.attnum > 0 AND NOT a.attisdropped;
        EXECUTE cow._apply_code(g.relid, ncols, setcols, has_always, g.pk_columns,
                                format('(SELECT * FROM %s c WHERE %s = ANY ($3))', sel, ckey))
        INTO m, n USING session, chosen, ARRAY(SELECT jsonb_array_elements(pending -> i::text));
        stats := summary -> (g.table_schema || '.' || g.table_name);
        IF setcols IS NOT NULL THEN
            stats := jsonb_set(stats, '{updated}', to_jsonb((stats ->> 'updated')::bigint + m));
        END IF;
        stats := jsonb_set(stats, '{inserted}', to_jsonb((stats ->> 'inserted')::bigint + n));
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name], stats);
    END LOOP;
    -- The rows added to keyless tables, last: nothing references them (no unique index), they may reference
    -- any row written above.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        CONTINUE WHEN g.pk_columns <> '{}';
        stats := summary -> (g.table_schema || '.' || g.table_name);
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name],
                             jsonb_set(stats, '{inserted}', to_jsonb(cow._kl_commit(g, session, chosen, on_conflict, false))));
    END LOOP;
    -- Drop what was applied; later writes of other operations stay, now based on the new base rows.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        IF g.pk_columns = '{}' AND chosen IS NOT NULL THEN
            remaining := remaining + cow._kl_commit_rebase(g, session, chosen);
            CONTINUE;
        END IF;
        IF chosen IS NULL THEN
            EXECUTE format('DELETE FROM cow_changes.%I WHERE _cow_session = $1', g.changes_table) USING session;
        ELSE
            -- Re-base the origins too: a move this commit applied (base key o now at key k) makes k the base
            -- key its later writes descend from; left at o, the next commit would take the row at k for a
            -- key the session took over and delete it (firing ON DELETE on children it never touched).
            EXECUTE format('UPDATE cow_changes.%1$I r SET _cow_origin = m.k '
                           'FROM (SELECT DISTINCT ON (c._cow_origin) c._cow_origin AS o, jsonb_build_object(%3$s) AS k '
                           '      FROM %2$s c WHERE NOT c._cow_deleted AND c._cow_origin IS NOT NULL '
                           '      AND c._cow_origin <> jsonb_build_object(%3$s) ORDER BY c._cow_origin, c._cow_seq DESC) m '
                           'WHERE r._cow_session = $1 AND NOT r._cow_op = ANY ($2) AND r._cow_origin = m.o',
                           g.changes_table,
                           format('(SELECT DISTINCT ON (%s) c.* FROM cow_changes.%I c WHERE c._cow_session = $1 '
                                  'AND c._cow_op = ANY ($2) ORDER BY %s, c._cow_seq DESC)',
                                  cow._collist(g.pk_columns, 'c.'), g.changes_table, cow._collist(g.pk_columns, 'c.')),
                           cow._jsonargs(g.pk_columns, 'c'))
            USING session, chosen;
            EXECUTE format('DELETE FROM cow_changes.%I WHERE _cow_session = $1 AND _cow_op = ANY ($2)', g.changes_table)
            USING session, chosen;
            EXECUTE format('UPDATE cow_changes.%1$I c SET _cow_base = (SELECT to_jsonb(b.*) FROM %2$I.%3$I b WHERE %4$s) '
                           'WHERE c._cow_session = $1', g.changes_table, g.table_schema, g.table_name,
                           cow._eq(g.pk_columns, 'b', 'c'))
            USING session;
            EXECUTE format('SELECT count(*) FROM cow_changes.%I WHERE _cow_session = $1', g.changes_table)
            INTO n USING session;
            remaining := remaining + n;
        END IF;
    END LOOP;
    IF remaining = 0 THEN
        UPDATE cow.sessions SET status = 'committed' WHERE session_id = session;
    END IF;
    PERFORM set_config('cow.session_id', coalesce(prev, ''), true);
    RETURN jsonb_build_object('session', session, 'tables', summary, 'operations', to_jsonb(chosen),
                              'remaining_changes', remaining, 'status', CASE WHEN remaining = 0 THEN 'committed' ELSE 'open' END);
END $$;
