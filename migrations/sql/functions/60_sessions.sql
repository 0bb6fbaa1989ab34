-- cowproxy copy-on-write layer: the session API: registry, write log, diff, discard.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- ---------------------------------------------------------------------------------------------------------
-- Sessions: registry, write log, diff, discard, commit
-- ---------------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION cow.create_session(session text, kind text DEFAULT 'agent', label text DEFAULT NULL,
                                              prompt text DEFAULT NULL, model text DEFAULT NULL,
                                              gt_session text DEFAULT NULL, metadata jsonb DEFAULT '{}')
RETURNS cow.sessions
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    row cow.sessions;
BEGIN
    PERFORM cow._refuse_bound('create_session');
    IF session IS NULL OR NOT cow.valid_id(session) THEN
        PERFORM cow._check_id(coalesce(session, ''), 'session');
    END IF;
    PERFORM cow._check_id(gt_session, 'session');
    IF kind IS NULL OR kind NOT IN ('ground_truth', 'agent', 'other') THEN
        RAISE EXCEPTION 'invalid session kind %: use ground_truth, agent or other', quote_literal(coalesce(kind, 'NULL'))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF metadata IS NOT NULL AND jsonb_typeof(metadata) <> 'object' THEN
        RAISE EXCEPTION 'session metadata must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO cow.sessions (session_id, kind, label, prompt, model, gt_session, metadata)
    VALUES (session, kind, label, prompt, model, gt_session, coalesce(metadata, '{}'))
    ON CONFLICT (session_id) DO NOTHING
    RETURNING * INTO row;
    IF row.session_id IS NULL THEN
        RAISE EXCEPTION 'session % already exists', session USING ERRCODE = 'duplicate_object';
    END IF;
    RETURN row;
END $$;

-- A session's status changed or its row went: bump cow.session_closes (migration 0006), which ends the
-- connections' cached registry checks (cow._open_stamp). Sequences are not transactional: the bump is seen
-- at once, while the row is still locked by the closing transaction, and a rolled-back close only costs the
-- writers one more check each.
CREATE OR REPLACE FUNCTION cow._session_closed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('cow.session_closes');
    RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER cow_session_status AFTER UPDATE OF status ON cow.sessions
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION cow._session_closed();
CREATE OR REPLACE TRIGGER cow_session_gone AFTER DELETE OR TRUNCATE ON cow.sessions
    FOR EACH STATEMENT EXECUTE FUNCTION cow._session_closed();

CREATE OR REPLACE FUNCTION cow._session_row(session text, p_lock boolean DEFAULT false) RETURNS cow.sessions
LANGUAGE plpgsql AS $$
DECLARE
    row cow.sessions;
BEGIN
    PERFORM cow._check_id(coalesce(session, ''), 'session');
    IF p_lock THEN
        SELECT * INTO row FROM cow.sessions s WHERE s.session_id = session FOR UPDATE;
    ELSE
        SELECT * INTO row FROM cow.sessions s WHERE s.session_id = session;
    END IF;
    IF row.session_id IS NULL THEN
        RAISE EXCEPTION 'unknown session %', session USING ERRCODE = 'undefined_object';
    END IF;
    RETURN row;
END $$;

CREATE OR REPLACE FUNCTION cow._meta_columns() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$ SELECT '{_cow_seq,_cow_session,_cow_op,_cow_deleted,_cow_current,_cow_base,_cow_fk,_cow_origin}'::text[] $$;

-- The per-table SELECTs of the session functions below over every changes table (`c`), joined by UNION ALL
-- (NULL: no table is enabled). In p_select, {schema} and {table} stand for the table's name as text
-- literals, {pk} for its primary key as a jsonb object and {pkcols} for the key columns of `c` (for a keyless
-- table both are the row's whole value as jsonb).
CREATE OR REPLACE FUNCTION cow._changes_union(p_select text, p_where text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT string_agg(format('SELECT %s FROM cow_changes.%I c WHERE %s',
        replace(replace(replace(replace(p_select,
            '{schema}', quote_literal(g.table_schema) || '::text'),
            '{table}', quote_literal(g.table_name) || '::text'),
            -- (A keyless table, pk_columns '{}': a row is identified by its whole value.)
            '{pk}', CASE WHEN g.pk_columns = '{}' THEN '(to_jsonb(c.*) - cow._meta_columns())'
                         ELSE format('jsonb_build_object(%s)', cow._jsonargs(g.pk_columns, 'c')) END),
            '{pkcols}', CASE WHEN g.pk_columns = '{}' THEN '(to_jsonb(c.*) - cow._meta_columns())'
                             ELSE cow._collist(g.pk_columns, 'c.') END),
        g.changes_table, p_where), ' UNION ALL ')
    FROM cow.registry g
$$;

-- The session's write log, one row per row written, in write order.
CREATE OR REPLACE FUNCTION cow.session_changes(session text)
RETURNS TABLE (seq bigint, operation_id text, table_schema text, table_name text, pk jsonb, row_data jsonb,
               deleted boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
BEGIN
    PERFORM cow._check_id(coalesce(session, ''), 'session');
    PERFORM cow._refuse_other('session_changes', session);
    q := cow._changes_union(
        'c._cow_seq, c._cow_op, {schema}, {table}, {pk}, '
        'CASE WHEN c._cow_deleted THEN NULL ELSE to_jsonb(c.*) - cow._meta_columns() END, c._cow_deleted',
        'c._cow_session = $1');
    IF q IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE q || ' ORDER BY 1' USING session;
END $$;

-- The session's net effect per row: what commit would apply, with the base row as the session first saw it.
CREATE OR REPLACE FUNCTION cow.session_diff(session text)
RETURNS TABLE (table_schema text, table_name text, pk jsonb, action text, old_row jsonb, new_row jsonb,
               changed jsonb, seq bigint, operation_id text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
BEGIN
    PERFORM cow._check_id(coalesce(session, ''), 'session');
    PERFORM cow._refuse_other('session_diff', session);
    q := cow._changes_union(
        '{schema}, {table}, {pk}, c._cow_deleted, c._cow_base, '
        'CASE WHEN c._cow_deleted THEN NULL ELSE to_jsonb(c.*) - cow._meta_columns() END, c._cow_seq, c._cow_op',
        'c._cow_session = $1 AND c._cow_current');
    IF q IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT d.s, d.t, d.k, a.action, d.o, d.n, a.changed, d.q, d.op FROM (%s) AS d(s, t, k, del, o, n, q, op) '
        'CROSS JOIN LATERAL (SELECT CASE WHEN d.del AND d.o IS NOT NULL THEN ''delete'' '
        '                                WHEN NOT d.del AND d.o IS NULL THEN ''insert'' '
        '                                WHEN NOT d.del AND d.o IS DISTINCT FROM d.n THEN ''update'' END AS action, '
        '  (SELECT jsonb_object_agg(e.key, jsonb_build_array(d.o -> e.key, e.value)) FROM jsonb_each(d.n) e '
        '   WHERE d.o IS NOT NULL AND (d.o -> e.key) IS DISTINCT FROM e.value) AS changed) a '
        'WHERE a.action IS NOT NULL ORDER BY d.s, d.t, d.q', q) USING session;
END $$;

-- Every key the session wrote, with the base row as the session first saw it (NULL: absent).
CREATE OR REPLACE FUNCTION cow.session_keys(session text)
RETURNS TABLE (table_schema text, table_name text, pk jsonb, base_row jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
BEGIN
    PERFORM cow._check_id(coalesce(session, ''), 'session');
    PERFORM cow._refuse_other('session_keys', session);
    q := cow._changes_union('DISTINCT ON ({pkcols}) {schema}, {table}, {pk}, c._cow_base', 'c._cow_session = $1');
    IF q IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY EXECUTE q USING session;
END $$;

CREATE OR REPLACE FUNCTION cow.discard_session(session text) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
    n bigint;
    total bigint := 0;
BEGIN
    PERFORM cow._refuse_bound('discard_session');
    PERFORM cow._session_row(session, true);
    FOR g IN SELECT changes_table FROM cow.registry ORDER BY id LOOP
        EXECUTE format('DELETE FROM cow_changes.%I WHERE _cow_session = $1', g.changes_table) USING session;
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    UPDATE cow.sessions SET status = 'discarded' WHERE session_id = session;
    RETURN total;
END $$;

-- Enabled tables, parents before children (FK cycles fall back to registry order).
CREATE OR REPLACE FUNCTION cow._table_order() RETURNS int[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    done int[] := '{}';
    pick int;
BEGIN
    LOOP
        SELECT g.id INTO pick FROM cow.registry g
        WHERE NOT g.id = ANY (done)
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c JOIN cow.registry p ON p.relid = c.confrelid
                          WHERE c.contype = 'f' AND c.conrelid = g.relid AND p.id <> g.id AND NOT p.id = ANY (done))
        ORDER BY g.id LIMIT 1;
        IF pick IS NULL THEN
            SELECT g.id INTO pick FROM cow.registry g WHERE NOT g.id = ANY (done) ORDER BY g.id LIMIT 1;
            EXIT WHEN pick IS NULL;
        END IF;
        done := done || pick;
    END LOOP;
    RETURN done;
END $$;

-- The operations that `ops` depend on: earlier writes of the same row, and earlier writes of the FK parent
-- row a written row references. Returns the closure (ops included).
CREATE OR REPLACE FUNCTION cow.operation_closure(session text, ops text[]) RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    unknown text[];
    result text[];
BEGIN
    PERFORM cow._refuse_other('operation_closure', session);
    SELECT array_agg(o) INTO unknown FROM unnest(ops) AS o
    WHERE NOT EXISTS (SELECT 1 FROM cow.session_changes(session) w WHERE w.operation_id = o);
    IF unknown IS NOT NULL THEN
        RAISE EXCEPTION 'session % has no operation %', session, array_to_string(unknown, ', ')
            USING ERRCODE = 'undefined_object';
    END IF;
    -- One pass over the log: dependency edges (an operation -> the previous write of each row it wrote, and
    -- every earlier write of each FK parent row its rows reference), then their transitive closure.
    WITH RECURSIVE
    w AS MATERIALIZED (
        SELECT c.seq, c.operation_id AS op, g.relid AS tbl, c.pk, c.row_data
        FROM cow.session_changes(session) c JOIN cow.registry g USING (table_schema, table_name)),
    fk AS MATERIALIZED (
        SELECT c.oid, c.conrelid AS child, c.confrelid AS parent, cow._attnames(c.conrelid, c.conkey) AS fcols,
               cow._attnames(c.confrelid, c.confkey) AS pcols
        FROM pg_constraint c
        WHERE c.contype = 'f' AND c.conrelid IN (SELECT relid FROM cow.registry)
          AND c.confrelid IN (SELECT relid FROM cow.registry)),
    refs AS (  -- (constraint, key) each child write references
        SELECT f.oid, w.seq, w.op, (SELECT jsonb_agg(w.row_data -> x ORDER BY n) FROM unnest(f.fcols) WITH ORDINALITY AS u(x, n)) AS k
        FROM w JOIN fk f ON f.child = w.tbl WHERE w.row_data IS NOT NULL),
    keys AS (  -- (constraint, key) each parent write holds
        SELECT f.oid, w.seq, w.op, (SELECT jsonb_agg(w.row_data -> x ORDER BY n) FROM unnest(f.pcols) WITH ORDINALITY AS u(x, n)) AS k
        FROM w JOIN fk f ON f.parent = w.tbl WHERE w.row_data IS NOT NULL),
    edge AS (
        SELECT l.op, l.prev AS dep
        FROM (SELECT op, lag(op) OVER (PARTITION BY tbl, pk ORDER BY seq) AS prev FROM w) l
        WHERE l.prev IS NOT NULL AND l.prev <> l.op
        UNION
        SELECT r.op, k.op FROM refs r JOIN keys k ON k.oid = r.oid AND k.k = r.k AND k.seq < r.seq
        WHERE r.op <> k.op AND NOT r.k @> '[null]'::jsonb),
    closure(op) AS (
        SELECT unnest(ops)
        UNION
        SELECT e.dep FROM edge e JOIN closure c ON e.op = c.op)
    SELECT array_agg(DISTINCT op ORDER BY op) INTO result FROM closure;
    RETURN result;
END $$;
