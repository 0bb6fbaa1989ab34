-- cowproxy copy-on-write layer, core (version 1).
-- Everything the layer creates lives in schema cow, in the changes schema cow_changes and in one overlay schema
-- per app schema; app tables only get a statement-level guard trigger. Functions are CREATE OR REPLACE so a
-- later migration file can redefine them and `install` regenerates the per-table objects.

CREATE SCHEMA IF NOT EXISTS cow;
CREATE SCHEMA IF NOT EXISTS cow_changes;

-- Orders every write of every session (never now(): same-transaction writes must not tie).
CREATE SEQUENCE IF NOT EXISTS cow.write_seq;

CREATE TABLE IF NOT EXISTS cow.schemas (
    schema_name    text PRIMARY KEY,
    overlay_schema text NOT NULL UNIQUE,
    excluded       text[] NOT NULL DEFAULT '{}'
);

CREATE TABLE IF NOT EXISTS cow.registry (
    id             serial PRIMARY KEY,
    relid          oid NOT NULL UNIQUE,
    table_schema   text NOT NULL,
    table_name     text NOT NULL,
    overlay_schema text NOT NULL,
    changes_table  text NOT NULL UNIQUE,
    pk_columns     text[] NOT NULL,
    col_attnums    int[] NOT NULL DEFAULT '{}',
    col_names      text[] NOT NULL DEFAULT '{}',
    col_types      text[] NOT NULL DEFAULT '{}',
    signature      text,
    UNIQUE (table_schema, table_name)
);

CREATE OR REPLACE VIEW cow.tables AS
SELECT table_schema, table_name, overlay_schema, pk_columns
FROM cow.registry ORDER BY table_schema, table_name;

CREATE TABLE IF NOT EXISTS cow.sessions (
    session_id     text PRIMARY KEY CHECK (session_id ~ '^[A-Za-z0-9._:-]{1,128}$'),
    kind           text NOT NULL DEFAULT 'other' CHECK (kind IN ('ground_truth', 'agent', 'other')),
    label          text,
    prompt         text,
    model          text,
    gt_session     text,
    metadata       jsonb NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now(),
    first_write_at timestamptz,
    last_write_at  timestamptz,
    status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'committed', 'discarded'))
);

-- The generated triggers run with the privileges of the writing role (no SECURITY DEFINER: a definer function
-- would run app-supplied search_path lookups as the installer), so every role may write the changes tables.
GRANT USAGE ON SCHEMA cow, cow_changes TO PUBLIC;
GRANT SELECT, INSERT, UPDATE ON cow.sessions TO PUBLIC;
GRANT USAGE, SELECT ON SEQUENCE cow.write_seq TO PUBLIC;
GRANT SELECT ON cow.registry, cow.schemas, cow.tables TO PUBLIC;

-- ---------------------------------------------------------------------------------------------------------
-- Session GUCs
-- ---------------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION cow.valid_id(p text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT p ~ '^[A-Za-z0-9._:-]{1,128}$' $$;

CREATE OR REPLACE FUNCTION cow._check_id(p text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p IS NOT NULL AND NOT cow.valid_id(p) THEN
        RAISE EXCEPTION 'invalid % id %: ids are 1-128 characters of [A-Za-z0-9._:-]', what, left(quote_literal(p), 140)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- View default of a GENERATED ALWAYS identity or a generated column: the value, plus a transaction-local flag
-- the INSTEAD OF trigger consumes, so that an explicit value can be told from DEFAULT (428C9, as PostgreSQL).
CREATE OR REPLACE FUNCTION cow._defaulted(value anyelement, flag text) RETURNS anyelement
LANGUAGE sql VOLATILE AS $$ SELECT CASE WHEN pg_catalog.set_config(flag, 'on', true) IS NOT NULL THEN value END $$;

CREATE OR REPLACE FUNCTION cow.current_session() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT nullif(current_setting('cow.session_id', true), '') $$;

-- search_path entries, unquoted, in order.
CREATE OR REPLACE FUNCTION cow._path_entries(p text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(CASE WHEN m[1] IS NOT NULL THEN replace(m[1], '""', '"') ELSE btrim(m[2]) END
                              ORDER BY ord), '{}')
    FROM regexp_matches(coalesce(p, ''), '\s*(?:"((?:[^"]|"")*)"|([^,]+))\s*(?:,|$)', 'g') WITH ORDINALITY AS t(m, ord)
    WHERE coalesce(m[1], btrim(m[2])) <> ''
$$;

CREATE OR REPLACE FUNCTION cow._path_text(entries text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(CASE WHEN e = '$user' THEN '"$user"' ELSE quote_ident(e) END, ', ' ORDER BY ord), '')
    FROM unnest(entries) WITH ORDINALITY AS t(e, ord)
$$;

-- The search_path without overlay schemas, then (when joining) with each enabled schema's overlay right before it.
CREATE OR REPLACE FUNCTION cow._session_path(p_join boolean) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    entries text[] := cow._path_entries(current_setting('search_path'));
    result text[] := '{}';
    e text;
    ov text;
    placed boolean := false;
BEGIN
    FOREACH e IN ARRAY entries LOOP
        CONTINUE WHEN e IN (SELECT overlay_schema FROM cow.schemas);
        IF p_join THEN
            SELECT overlay_schema INTO ov FROM cow.schemas
            WHERE schema_name = CASE WHEN e = '$user' THEN current_user ELSE e END;
            IF ov IS NOT NULL AND NOT ov = ANY (result) THEN
                result := result || ov;
                placed := true;
            END IF;
        END IF;
        result := result || e;
    END LOOP;
    IF p_join AND NOT placed THEN
        -- No enabled schema on the path: put every overlay first so that unqualified names still resolve.
        result := ARRAY(SELECT overlay_schema FROM cow.schemas ORDER BY schema_name) || result;
    END IF;
    RETURN cow._path_text(result);
END $$;

CREATE OR REPLACE FUNCTION cow.use_session(session text, operation text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    session := nullif(session, '');
    operation := nullif(operation, '');
    PERFORM cow._check_id(session, 'session');
    PERFORM cow._check_id(operation, 'operation');
    PERFORM set_config('cow.session_id', coalesce(session, ''), false);
    PERFORM set_config('cow.operation_id', CASE WHEN session IS NULL THEN '' ELSE coalesce(operation, '') END, false);
    PERFORM set_config('search_path', cow._session_path(session IS NOT NULL), false);
    RETURN session;
END $$;

CREATE OR REPLACE FUNCTION cow.use_operation(operation text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    operation := nullif(operation, '');
    PERFORM cow._check_id(operation, 'operation');
    PERFORM set_config('cow.operation_id', coalesce(operation, ''), false);
    RETURN operation;
END $$;

-- Called by every trigger that records a change: the current session (NULL: none). Registers the session and
-- validates the ids once per transaction.
CREATE OR REPLACE FUNCTION cow._write_session() RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text := nullif(current_setting('cow.session_id', true), '');
    stamp text;
    st text;
    lw timestamptz;
BEGIN
    IF s IS NULL THEN
        RETURN NULL;
    END IF;
    stamp := s || '/' || pg_current_xact_id()::text;
    IF current_setting('cow._registered', true) IS DISTINCT FROM stamp THEN
        -- Ids set with SET or startup options did not go through cow.use_session: check them here (inline:
        -- this runs once per write transaction).
        IF s !~ '^[A-Za-z0-9._:-]{1,128}$'
           OR coalesce(current_setting('cow.operation_id', true), '') !~ '^([A-Za-z0-9._:-]{1,128})?$' THEN
            PERFORM cow._check_id(s, 'session');
            PERFORM cow._check_id(nullif(current_setting('cow.operation_id', true), ''), 'operation');
        END IF;
        -- Never hold the registry row for the rest of the transaction: concurrent transactions of one session
        -- (a pooled application) must not queue behind each other. A new session is inserted (ON CONFLICT DO
        -- NOTHING takes no lock on an existing row); an existing one gets its timestamps only when no other
        -- transaction holds its row (SKIP LOCKED), so last_write_at is approximate under concurrency.
        SELECT x.status, x.last_write_at INTO st, lw FROM cow.sessions x WHERE x.session_id = s;
        IF st IS NULL THEN
            INSERT INTO cow.sessions (session_id, kind, first_write_at, last_write_at)
            VALUES (s, 'other', now(), now())
            ON CONFLICT (session_id) DO NOTHING;
            SELECT x.status INTO st FROM cow.sessions x WHERE x.session_id = s;
        ELSIF lw IS NULL OR lw < now() - interval '1 second' THEN
            -- (At most about once a second: a registry update per transaction would double a write's cost.)
            UPDATE cow.sessions x SET last_write_at = now(), first_write_at = coalesce(x.first_write_at, now())
            WHERE x.session_id = (SELECT y.session_id FROM cow.sessions y WHERE y.session_id = s
                                  FOR UPDATE SKIP LOCKED);
        END IF;
        IF st <> 'open' THEN
            RAISE EXCEPTION 'session % is %: it takes no more writes', s, st
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        PERFORM set_config('cow._registered', stamp, true);
    END IF;
    RETURN s;
END $$;

-- The operation of the current write: cow.operation_id, else one id per top-level transaction.
CREATE OR REPLACE FUNCTION cow._write_operation() RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(nullif(current_setting('cow.operation_id', true), ''), 'xact:' || pg_current_xact_id()::text)
$$;

-- ---------------------------------------------------------------------------------------------------------
-- The fail-closed guard on base tables
-- ---------------------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION cow.guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('cow.session_id', true) <> '' THEN
        RAISE EXCEPTION 'cowproxy: % on base table %.% refused: the connection is in session % (write through the overlay view, or leave the session with cow.use_session(NULL))',
            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), current_setting('cow.session_id', true)
            USING ERRCODE = 'insufficient_privilege', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION cow._add_guard(p_rel oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The WHEN clause keeps untagged writes from calling plpgsql at all (a plain expression per statement).
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = p_rel AND tgname = 'cow_guard' AND tgqual IS NOT NULL) THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER cow_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                       'FOR EACH STATEMENT WHEN (pg_catalog.current_setting(''cow.session_id'', true) <> '''') '
                       'EXECUTE FUNCTION cow.guard()', p_rel::regclass);
    END IF;
END $$;

-- ---------------------------------------------------------------------------------------------------------
-- Code generation helpers
-- ---------------------------------------------------------------------------------------------------------

-- "a.x = b.x AND a.y = b.y" over cols.
CREATE OR REPLACE FUNCTION cow._eq(cols text[], l text, r text, l_cols text[] DEFAULT NULL) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(format('%s.%I = %s.%I', l, coalesce(l_cols[i], cols[i]), r, cols[i]), ' AND ' ORDER BY i)
    FROM generate_subscripts(cols, 1) AS i
$$;

-- "r.x IS NOT NULL AND r.y IS NOT NULL"
CREATE OR REPLACE FUNCTION cow._notnull(cols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(format('%s.%I IS NOT NULL', r, c), ' AND ' ORDER BY i)
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

-- "(NEW.x IS DISTINCT FROM OLD.x OR ...)"
CREATE OR REPLACE FUNCTION cow._changed(cols text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '(' || string_agg(format('NEW.%I IS DISTINCT FROM OLD.%I', c, c), ' OR ' ORDER BY i) || ')'
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

-- "concat_ws(', ', coalesce(r.x::text, 'null'), ...)": key values for error details.
CREATE OR REPLACE FUNCTION cow._keytext(cols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'concat_ws('', '', ' || string_agg(format('coalesce(%s.%I::text, ''null'')', r, c), ', ' ORDER BY i) || ')'
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

CREATE OR REPLACE FUNCTION cow._collist(cols text[], prefix text DEFAULT '') RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(prefix || quote_ident(c), ', ' ORDER BY i), '')
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

CREATE OR REPLACE FUNCTION cow._attnames(p_rel oid, p_nums int2[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT array_agg(a.attname::text ORDER BY k.i)
    FROM unnest(p_nums) WITH ORDINALITY AS k(n, i)
    JOIN pg_attribute a ON a.attrelid = p_rel AND a.attnum = k.n
$$;

CREATE OR REPLACE FUNCTION cow._overlay_name(p_schema text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length('cow_overlay_' || p_schema) <= 63 THEN 'cow_overlay_' || p_schema
                ELSE 'cow_overlay_' || left(p_schema, 40) || '_' || left(md5(p_schema), 8) END
$$;

-- The relation rows are read from in a session: the overlay view of an enabled table, else the table itself.
CREATE OR REPLACE FUNCTION cow._session_rel(p_rel oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT format('%I.%I', overlay_schema, table_name) FROM cow.registry WHERE relid = p_rel),
                    p_rel::regclass::text)
$$;

CREATE OR REPLACE FUNCTION cow._pk_columns(p_rel oid) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT cow._attnames(p_rel, i.indkey::int2[])
    FROM pg_index i WHERE i.indrelid = p_rel AND i.indisprimary
$$;

-- A fingerprint of everything the generated objects depend on: when it changes, regenerate.
CREATE OR REPLACE FUNCTION cow._signature(p_rel oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT md5(concat_ws('|',
        p_rel::regclass::text,
        (SELECT string_agg(concat_ws(':', a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                     a.attgenerated, a.attidentity, pg_get_expr(d.adbin, d.adrelid)), ',' ORDER BY a.attnum)
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped),
        (SELECT string_agg(c.conname || pg_get_constraintdef(c.oid) || c.conrelid::regclass::text
                           || cow._session_rel(c.conrelid) || cow._session_rel(c.confrelid), ',' ORDER BY c.conname, c.oid)
         FROM pg_constraint c WHERE c.conrelid = p_rel OR c.confrelid = p_rel),
        (SELECT string_agg(pg_get_indexdef(i.indexrelid), ',' ORDER BY i.indexrelid)
         FROM pg_index i WHERE i.indrelid = p_rel AND i.indisunique),
        (SELECT string_agg(coalesce(c.relacl::text, ''), ',') FROM pg_class c WHERE c.oid = p_rel),
        (SELECT string_agg(pg_get_partition_constraintdef(t.relid), ',' ORDER BY t.relid)
         FROM pg_partition_tree(p_rel) t WHERE t.isleaf AND t.relid <> p_rel)))
$$;

CREATE OR REPLACE FUNCTION cow._eq2(lcols text[], l text, rcols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(format('%s.%I = %s.%I', l, lcols[i], r, rcols[i]), ' AND ' ORDER BY i)
    FROM generate_subscripts(lcols, 1) AS i
$$;

-- "SELECT r.a AS a, r.b AS b": a row source naming a record's fields as columns, for generated-column and CHECK
-- expressions (which name columns bare).
CREATE OR REPLACE FUNCTION cow._rowsrc(cols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'SELECT ' || string_agg(format('%s.%I AS %I', r, c, c), ', ' ORDER BY i)
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

CREATE OR REPLACE FUNCTION cow._raise(errcode text, message text, detail text, p_schema text, p_table text,
                                      p_constraint text DEFAULT NULL, p_column text DEFAULT NULL) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('RAISE EXCEPTION USING ERRCODE = %L, MESSAGE = %L%s, SCHEMA = %L, TABLE = %L%s%s;',
                  errcode, message, CASE WHEN detail IS NULL THEN '' ELSE ', DETAIL = ' || detail END,
                  p_schema, p_table,
                  CASE WHEN p_constraint IS NULL THEN '' ELSE format(', CONSTRAINT = %L', p_constraint) END,
                  CASE WHEN p_column IS NULL THEN '' ELSE format(', COLUMN = %L', p_column) END)
$$;

-- ---------------------------------------------------------------------------------------------------------
-- Per-table objects: the changes table, the overlay view, the INSTEAD OF triggers
-- ---------------------------------------------------------------------------------------------------------

-- Create or bring in step the changes table of registry entry p_id, then (re)create its overlay view.
CREATE OR REPLACE FUNCTION cow._build_view(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    rel oid;
    sch text;
    tab text;
    ch text;
    v text;
    b text;
    names text[];
    types text[];
    nums int[];
    pk text[];
    k int;
    i int;
    sess text := $$nullif(pg_catalog.current_setting('cow.session_id', true), '')$$;
    col record;
    idx record;
    n int := 0;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    rel := r.relid;
    SELECT n2.nspname, c.relname INTO sch, tab FROM pg_class c JOIN pg_namespace n2 ON n2.oid = c.relnamespace
    WHERE c.oid = rel;
    ch := format('cow_changes.%I', r.changes_table);
    b := format('%I.%I', sch, tab);
    -- The old view (under its old name, if the table was renamed) goes first: it depends on the columns.
    EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', r.overlay_schema, r.table_name);
    SELECT array_agg(a.attname::text ORDER BY a.attnum),
           array_agg(format_type(a.atttypid, a.atttypmod)
                     || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                             THEN ' COLLATE ' || (SELECT format('%I.%I', cn.nspname, co.collname)
                                                  FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                                                  WHERE co.oid = a.attcollation)
                             ELSE '' END ORDER BY a.attnum),
           array_agg(a.attnum::int ORDER BY a.attnum)
    INTO names, types, nums
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;
    pk := cow._pk_columns(rel);

    IF to_regclass(ch) IS NULL THEN
        EXECUTE format('CREATE TABLE %s (_cow_seq bigint NOT NULL DEFAULT nextval(''cow.write_seq''), '
                       '_cow_session text NOT NULL, _cow_op text NOT NULL, _cow_deleted boolean NOT NULL, '
                       '_cow_current boolean NOT NULL DEFAULT true, _cow_base jsonb, _cow_fk int NOT NULL DEFAULT 0, '
                       '_cow_origin jsonb%s)',
                       ch, (SELECT string_agg(format(', %I %s', names[j], types[j]), '' ORDER BY j)
                            FROM generate_subscripts(names, 1) AS j));
        EXECUTE format('CREATE INDEX %I ON %s (_cow_session, _cow_seq)', r.changes_table || '_log', ch);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON %s TO PUBLIC', ch);
    ELSE
        EXECUTE format('ALTER TABLE %s ADD COLUMN IF NOT EXISTS _cow_fk int NOT NULL DEFAULT 0, '
                       'ADD COLUMN IF NOT EXISTS _cow_origin jsonb', ch);
        -- Follow app DDL by attribute number: dropped, renamed, retyped and added columns.
        FOR i IN 1 .. coalesce(array_length(r.col_attnums, 1), 0) LOOP
            k := array_position(nums, r.col_attnums[i]);
            IF k IS NULL THEN
                EXECUTE format('ALTER TABLE %s DROP COLUMN IF EXISTS %I', ch, r.col_names[i]);
            ELSE
                IF names[k] <> r.col_names[i] THEN
                    EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', ch, r.col_names[i], names[k]);
                END IF;
                IF types[k] <> r.col_types[i] THEN
                    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s', ch, names[k], types[k],
                                   names[k], split_part(types[k], ' COLLATE ', 1));
                END IF;
            END IF;
        END LOOP;
        FOR k IN 1 .. array_length(nums, 1) LOOP
            IF NOT nums[k] = ANY (r.col_attnums) THEN
                EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', ch, names[k], types[k]);
            END IF;
        END LOOP;
    END IF;
    -- The current version of each (session, key): what the overlay view merges.
    IF pk IS DISTINCT FROM r.pk_columns OR to_regclass(format('cow_changes.%I', r.changes_table || '_cur')) IS NULL THEN
        EXECUTE format('DROP INDEX IF EXISTS cow_changes.%I', r.changes_table || '_cur');
        EXECUTE format('CREATE UNIQUE INDEX %I ON %s (_cow_session, %s) WHERE _cow_current', r.changes_table || '_cur',
                       ch, cow._collist(pk));
    END IF;
    -- Lookups for the session's UNIQUE checks.
    FOR idx IN SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
               WHERE s.nspname = 'cow_changes' AND c.relkind = 'i' AND c.relname LIKE r.changes_table || '\_u%' LOOP
        EXECUTE format('DROP INDEX cow_changes.%I', idx.relname);
    END LOOP;
    FOR idx IN SELECT cow._attnames(rel, x.indkey::int2[]) AS cols FROM pg_index x
               WHERE x.indrelid = rel AND x.indisunique AND NOT x.indisprimary AND x.indpred IS NULL
                 AND x.indexprs IS NULL ORDER BY x.indexrelid LOOP
        n := n + 1;
        EXECUTE format('CREATE INDEX %I ON %s (_cow_session, %s) WHERE _cow_current AND NOT _cow_deleted',
                       r.changes_table || '_u' || n, ch, cow._collist(idx.cols));
    END LOOP;

    v := format('%I.%I', r.overlay_schema, tab);
    -- Three branches: with no session the first one alone runs (the others are cut by a one-time filter);
    -- in a session the base rows this session has not touched, then its current, not deleted, versions.
    EXECUTE format(
        'CREATE VIEW %1$s AS SELECT %2$s FROM %3$s b WHERE %5$s IS NULL '
        'UNION ALL SELECT %2$s FROM %3$s b WHERE %5$s IS NOT NULL AND NOT EXISTS ('
        'SELECT 1 FROM %4$s c WHERE c._cow_session = %5$s AND c._cow_current AND %6$s) '
        'UNION ALL SELECT %7$s FROM %4$s c WHERE %5$s IS NOT NULL AND c._cow_session = %5$s AND c._cow_current '
        'AND NOT c._cow_deleted',
        v, cow._collist(names, 'b.'), b, ch, sess, cow._eq(pk, 'c', 'b'), cow._collist(names, 'c.'));
    -- Defaults come from the base table (serial and identity values from its sequences).
    FOR col IN SELECT a.attname, a.attnum, pg_get_expr(d.adbin, d.adrelid) AS def, a.attidentity, a.attgenerated,
                      format_type(a.atttypid, a.atttypmod) AS typ
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped LOOP
        IF col.attidentity = 'a' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT cow._defaulted(nextval(%L::regclass), %L)', v,
                           col.attname, pg_get_serial_sequence(b, col.attname),
                           'cow._d_' || r.changes_table || '_' || col.attnum);
        ELSIF col.attgenerated <> '' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT cow._defaulted(NULL::%s, %L)', v, col.attname,
                           col.typ, 'cow._d_' || r.changes_table || '_' || col.attnum);
        ELSIF col.attidentity = 'd' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT nextval(%L::regclass)', v, col.attname,
                           pg_get_serial_sequence(b, col.attname));
        ELSIF col.def IS NOT NULL AND col.attgenerated = '' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT %s', v, col.attname, col.def);
        END IF;
    END LOOP;
    -- The view's privileges mirror the table's (the owner of the table gets them all).
    FOR col IN SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS who,
                      a.privilege_type AS priv
               FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
               WHERE c.oid = rel AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE') LOOP
        EXECUTE format('GRANT %s ON %s TO %s', col.priv, v, col.who);
    END LOOP;

    UPDATE cow.registry SET table_schema = sch, table_name = tab, pk_columns = pk, col_attnums = nums,
                            col_names = names, col_types = types
    WHERE id = p_id;
END $gen$;

-- Record a write of the row in record variable `var` (NEW or OLD) in the changes table: the previous current
-- version of that key stops being current; the first write of a key in the session snapshots the base row
-- (commit compares it to detect conflicts; diff shows it as the old row).
CREATE OR REPLACE FUNCTION cow._rec_code(ch text, b text, names text[], pk text[], var text, deleted boolean,
                                         fkmask text DEFAULT '0', mark_guc text DEFAULT NULL,
                                         origin text DEFAULT NULL)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $c$
    _seen := NULL;
    UPDATE %1$s x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND %3$s
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
    INSERT INTO %1$s (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, %5$s)
    VALUES (_s, _o, %6$s,
            CASE WHEN _seen THEN _base ELSE (SELECT pg_catalog.to_jsonb(y) FROM %2$s y WHERE %4$s) END,
            %8$s, %9$s, %7$s);
$c$, ch, b, cow._eq(pk, 'x', var), cow._eq(pk, 'y', var), cow._collist(names), CASE WHEN deleted THEN 'true' ELSE 'false' END,
       cow._collist(names, var || '.'),
       -- FOREIGN KEYs to check at the end of the statement: those this write changed, plus those an earlier
       -- write of the same row in the same (outermost) statement changed.
       CASE WHEN deleted OR mark_guc IS NULL THEN '0'
            ELSE format($m$(%s) | CASE WHEN _pseq > coalesce(nullif(pg_catalog.split_part(pg_catalog.current_setting(%L, true), ',', 1), '')::bigint, 9223372036854775807) THEN coalesce(_pfk, 0) ELSE 0 END$m$,
                        fkmask, mark_guc) END,
       -- The base key the row descends from: kept from the previous version, or the key itself when this is
       -- the session's first write of a row read from the base; an INSERT passes NULL.
       coalesce(origin, format('CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END',
                               (SELECT string_agg(format('%L, %s.%I', k, var, k), ', ') FROM unnest(pk) AS k))))
$$;

CREATE OR REPLACE FUNCTION cow._build_triggers(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    rel oid;
    sch text;
    tab text;
    ch text;
    v text;
    b text;
    names text[];
    ncols text[];      -- not generated: what an INSERT into the base table names
    setcols text[];    -- what an UPDATE of the base table sets (no generated, no GENERATED ALWAYS identity)
    pk text[];
    has_always boolean;
    gen_code text := '';
    nn_code text := '';
    chk_code text := '';
    uq_ins text := '';
    uq_upd text := '';
    fk_ins text := '';
    par_del_check text := '';
    par_upd_check text := '';
    par_del_act text := '';
    par_upd_act text := '';
    col record;
    con record;
    target text;
    keytxt text;
    pg18 boolean := current_setting('server_version_num')::int >= 180000;
    upd_raise text;
    msg text;
    det text;
    cond text;
    fn text;
    decl text := E'DECLARE\n    _s text := cow._write_session();\n    _o text;\n    _base jsonb;\n    _seen boolean;\n    _bad text;\n    _pfk int;\n    _pseq bigint;\n    _porig jsonb;\n    _morig jsonb;\n';
    fk_all text := '0';     -- every FOREIGN KEY bit (an INSERT checks them all)
    fk_changed text := '0'; -- the bits of the FOREIGN KEYs whose columns an UPDATE changed
    fk_n int := 0;
    mark_guc text;
    dflt_ins text := '';
    dflt_upd text := '';
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    rel := r.relid;
    sch := r.table_schema;
    tab := r.table_name;
    mark_guc := 'cow._mark_' || r.changes_table;
    ch := format('cow_changes.%I', r.changes_table);
    b := format('%I.%I', sch, tab);
    v := format('%I.%I', r.overlay_schema, tab);
    names := r.col_names;
    pk := r.pk_columns;
    SELECT array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = ''),
           array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '' AND a.attidentity <> 'a'),
           bool_or(a.attidentity = 'a')
    INTO ncols, setcols, has_always
    FROM pg_attribute a WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped;

    -- An explicit value for a GENERATED ALWAYS identity or a generated column (no DEFAULT flag): 428C9.
    FOR col IN SELECT a.attname, a.attnum, a.attidentity = 'a' AS ident FROM pg_attribute a
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
                 AND (a.attidentity = 'a' OR a.attgenerated <> '') ORDER BY a.attnum LOOP
        dflt_ins := dflt_ins || format(
            E'    IF pg_catalog.current_setting(%L, true) IS DISTINCT FROM ''on'' THEN\n'
             '        RAISE EXCEPTION USING ERRCODE = ''428C9'', MESSAGE = %L, DETAIL = %L%s;\n    END IF;\n'
             '    PERFORM pg_catalog.set_config(%L, '''', true);\n',
            'cow._d_' || r.changes_table || '_' || col.attnum,
            format('cannot insert a non-DEFAULT value into column "%s"', col.attname),
            CASE WHEN col.ident THEN format('Column "%s" is an identity column defined as GENERATED ALWAYS.', col.attname)
                 ELSE format('Column "%s" is a generated column.', col.attname) END,
            CASE WHEN col.ident THEN ', HINT = ''Use OVERRIDING SYSTEM VALUE to override.''' ELSE '' END,
            'cow._d_' || r.changes_table || '_' || col.attnum);
        dflt_upd := dflt_upd || format(
            E'    IF NEW.%I IS DISTINCT FROM OLD.%I AND pg_catalog.current_setting(%L, true) IS DISTINCT FROM ''on'' THEN\n'
             '        RAISE EXCEPTION USING ERRCODE = ''428C9'', MESSAGE = %L, DETAIL = %L;\n    END IF;\n'
             '    PERFORM pg_catalog.set_config(%L, '''', true);\n',
            col.attname, col.attname, 'cow._d_' || r.changes_table || '_' || col.attnum,
            format('column "%s" can only be updated to DEFAULT', col.attname),
            CASE WHEN col.ident THEN format('Column "%s" is an identity column defined as GENERATED ALWAYS.', col.attname)
                 ELSE format('Column "%s" is a generated column.', col.attname) END,
            'cow._d_' || r.changes_table || '_' || col.attnum);
    END LOOP;
    -- Generated columns: computed from the other columns, as the table would.
    FOR col IN SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) AS expr
               FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> ''
               ORDER BY a.attnum LOOP
        gen_code := gen_code || format(E'    SELECT (%s) INTO NEW.%I FROM (%s) AS _x;\n',
                                       col.expr, col.attname, cow._rowsrc(ncols, 'NEW'));
    END LOOP;
    -- A partitioned table: the row must fall into a partition (23514), checked first like PostgreSQL's routing.
    IF (SELECT relkind FROM pg_class WHERE oid = rel) = 'p' THEN
        SELECT string_agg('(' || pg_get_partition_constraintdef(t.relid) || ')', ' OR ' ORDER BY t.relid)
        INTO cond FROM pg_partition_tree(rel) t WHERE t.isleaf;
        gen_code := gen_code || format(E'    IF (SELECT %s FROM (%s) AS _x) IS NOT TRUE THEN\n        %s\n    END IF;\n',
            coalesce(cond, 'false'), cow._rowsrc(names, 'NEW'),
            cow._raise('23514', format('no partition of relation "%s" found for row', tab), NULL, sch, tab));
    END IF;
    -- NOT NULL (23502).
    FOR col IN SELECT a.attname FROM pg_attribute a
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull ORDER BY a.attnum LOOP
        nn_code := nn_code || format(E'    IF NEW.%I IS NULL THEN\n        %s\n    END IF;\n', col.attname,
            cow._raise('23502', format('null value in column "%s" of relation "%s" violates not-null constraint',
                                       col.attname, tab), NULL, sch, tab, NULL, col.attname));
    END LOOP;
    -- CHECK (23514), evaluated in one query, in constraint name order like PostgreSQL.
    SELECT string_agg(format('WHEN (%s) IS FALSE THEN %L', pg_get_expr(c.conbin, c.conrelid), c.conname),
                      ' ' ORDER BY c.conname)
    INTO cond
    FROM pg_constraint c WHERE c.conrelid = rel AND c.contype = 'c';
    IF cond IS NOT NULL THEN
        chk_code := format(E'    SELECT CASE %s END INTO _bad FROM (%s) AS _x;\n    IF _bad IS NOT NULL THEN\n'
                           '        RAISE EXCEPTION USING ERRCODE = ''23514'', MESSAGE = format(''new row for relation "%%s" violates check constraint "%%s"'', %L, _bad), SCHEMA = %L, TABLE = %L, CONSTRAINT = _bad;\n'
                           '    END IF;\n', cond, cow._rowsrc(names, 'NEW'), tab, sch, tab);
    END IF;
    -- PRIMARY KEY and UNIQUE (23505) against the session's view of the table.
    FOR con IN SELECT ic.relname AS name, cow._attnames(rel, x.indkey::int2[]) AS cols, x.indnullsnotdistinct AS nnd
               FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
               WHERE x.indrelid = rel AND x.indisunique AND x.indpred IS NULL AND x.indexprs IS NULL
               ORDER BY x.indexrelid LOOP
        keytxt := format('format(''Key (%%s)=(%%s) already exists.'', %L, %s)',
                         cow._collist(con.cols), cow._keytext(con.cols, 'NEW'));
        IF con.nnd THEN
            cond := (SELECT string_agg(format('z.%I IS NOT DISTINCT FROM NEW.%I', c, c), ' AND ')
                     FROM unnest(con.cols) AS c);
        ELSE
            cond := cow._eq(con.cols, 'z', 'NEW');
        END IF;
        uq_ins := uq_ins || format(E'    IF %s EXISTS (SELECT 1 FROM %s z WHERE %s) THEN\n        %s\n    END IF;\n',
            CASE WHEN con.nnd THEN '' ELSE cow._notnull(con.cols, 'NEW') || ' AND ' END, v, cond,
            cow._raise('23505', format('duplicate key value violates unique constraint "%s"', con.name), keytxt,
                       sch, tab, con.name));
        uq_upd := uq_upd || format(E'    IF %s AND %s EXISTS (SELECT 1 FROM %s z WHERE %s AND NOT (%s)) THEN\n        %s\n    END IF;\n',
            cow._changed(con.cols), CASE WHEN con.nnd THEN '' ELSE cow._notnull(con.cols, 'NEW') || ' AND ' END,
            v, cond, cow._eq(pk, 'z', 'OLD'),
            cow._raise('23505', format('duplicate key value violates unique constraint "%s"', con.name), keytxt,
                       sch, tab, con.name));
    END LOOP;
    -- FOREIGN KEY, this table as the child (23503): the parent must be in the session's view of the parent.
    -- Checked at the end of the statement like PostgreSQL's RI triggers (so a later row's NOT NULL, CHECK or
    -- UNIQUE error wins over an earlier row's missing parent): a BEFORE STATEMENT trigger pushes the current
    -- write sequence value, the AFTER STATEMENT trigger checks this session's rows written since.
    FOR con IN SELECT c.conname, cow._attnames(c.conrelid, c.conkey) AS cols, c.confrelid,
                      cow._attnames(c.confrelid, c.confkey) AS refcols, pr.relname AS parent
               FROM pg_constraint c JOIN pg_class pr ON pr.oid = c.confrelid
               WHERE c.conrelid = rel AND c.contype = 'f' ORDER BY c.conname LOOP
        target := cow._session_rel(con.confrelid);
        cond := format('%s AND NOT EXISTS (SELECT 1 FROM %s z WHERE %s)', cow._notnull(con.cols, 'c'), target,
                       cow._eq2(con.refcols, 'z', con.cols, 'c'));
        IF con.confrelid = rel THEN
            -- A row may reference itself.
            cond := cond || format(' AND NOT (%s)', cow._eq2(con.refcols, 'c', con.cols, 'c'));
        END IF;
        fk_all := fk_all || format(' | %s', 1 << least(fk_n, 30));
        fk_changed := fk_changed || format(' | CASE WHEN %s THEN %s ELSE 0 END', cow._changed(con.cols), 1 << least(fk_n, 30));
        cond := cond || format(' AND (c._cow_fk & %s) <> 0', 1 << least(fk_n, 30));
        fk_n := fk_n + 1;
        fk_ins := fk_ins || format(E'    SELECT c._cow_seq, format(''Key (%%s)=(%%s) is not present in table "%%s".'', %L, %s, %L)\n'
                                   '    INTO _seq, _det FROM %s c WHERE c._cow_session = _s AND c._cow_seq > _mark\n'
                                   '        AND c._cow_current AND NOT c._cow_deleted AND %s\n'
                                   '    ORDER BY c._cow_seq LIMIT 1;\n'
                                   '    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN\n'
                                   '        _best := _seq; _bdet := _det; _bcon := %L; _bmsg := %L;\n'
                                   '    END IF;\n',
                                   cow._collist(con.cols), cow._keytext(con.cols, 'c'), con.parent, ch, cond, con.conname,
                                   format('insert or update on table "%s" violates foreign key constraint "%s"',
                                          tab, con.conname));
    END LOOP;
    -- FOREIGN KEY, this table as the parent: ON DELETE / ON UPDATE actions within the session.
    FOR con IN SELECT c.conname, c.conrelid, cow._attnames(c.conrelid, c.conkey) AS cols,
                      cow._attnames(c.confrelid, c.confkey) AS refcols, c.confdeltype, c.confupdtype,
                      cow._attnames(c.conrelid, c.confdelsetcols) AS delsetcols, ck.relname AS child,
                      EXISTS (SELECT 1 FROM cow.registry g WHERE g.relid = c.conrelid) AS child_cow
               FROM pg_constraint c JOIN pg_class ck ON ck.oid = c.conrelid
               WHERE c.confrelid = rel AND c.contype = 'f' ORDER BY c.conname LOOP
        target := cow._session_rel(con.conrelid);
        cond := format('EXISTS (SELECT 1 FROM %s z WHERE %s)', target, cow._eq2(con.cols, 'z', con.refcols, 'OLD'));
        -- RESTRICT raises 23001 from PostgreSQL 18 on (23503 before); NO ACTION, and the refusal for a plain
        -- child, 23503.
        msg := format('update or delete on table "%s" violates foreign key constraint "%s" on table "%s"',
                      tab, con.conname, con.child);
        det := format('format(''Key (%%s)=(%%s) is still referenced from table "%%s".'', %L, %s, %L)',
                      cow._collist(con.refcols), cow._keytext(con.refcols, 'OLD'), con.child);
        keytxt := cow._raise(CASE WHEN con.confdeltype = 'r' AND con.child_cow AND pg18 THEN '23001' ELSE '23503' END,
                             msg, det, sch, tab, con.conname);
        upd_raise := cow._raise(CASE WHEN con.confupdtype = 'r' AND con.child_cow AND pg18 THEN '23001' ELSE '23503' END,
                                msg, det, sch, tab, con.conname);
        -- NO ACTION is checked at the end of the statement, like PostgreSQL (so `DELETE FROM t` of a whole
        -- self-referencing tree works): the statement's tombstones whose key is gone from the session's view
        -- must not be referenced. RESTRICT is checked at once.
        IF (con.confdeltype = 'a' OR con.confupdtype = 'a') AND con.child_cow THEN
            fk_ins := fk_ins || format(E'    SELECT c._cow_seq, format(''Key (%%s)=(%%s) is still referenced from table "%%s".'', %L, %s, %L)\n'
                                       '    INTO _seq, _det FROM %s c WHERE c._cow_session = _s AND c._cow_seq > _mark\n'
                                       '        AND c._cow_current AND c._cow_deleted AND %s\n'
                                       '        AND NOT EXISTS (SELECT 1 FROM %s z WHERE %s)\n'
                                       '        AND EXISTS (SELECT 1 FROM %s k WHERE %s)\n'
                                       '    ORDER BY c._cow_seq LIMIT 1;\n'
                                       '    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN\n'
                                       '        _best := _seq; _bdet := _det; _bcon := %L; _bmsg := %L;\n'
                                       '    END IF;\n',
                                       cow._collist(con.refcols), cow._keytext(con.refcols, 'c'), con.child, ch,
                                       cow._notnull(con.refcols, 'c'), v, cow._eq(con.refcols, 'z', 'c'),
                                       target, cow._eq2(con.cols, 'k', con.refcols, 'c'), con.conname, msg);
        END IF;
        -- A child table outside the layer cannot change in a session: any action is a refusal there.
        IF con.confdeltype = 'r' OR NOT con.child_cow THEN
            par_del_check := par_del_check || format(E'    IF %s THEN\n        %s\n    END IF;\n', cond, keytxt);
        ELSIF con.confdeltype = 'a' THEN
            NULL;  -- end of statement (above)
        ELSIF con.confdeltype = 'c' THEN
            par_del_act := par_del_act || format(E'    DELETE FROM %s z WHERE %s;\n', target,
                                                 cow._eq2(con.cols, 'z', con.refcols, 'OLD'));
        ELSE
            par_del_act := par_del_act || format(E'    UPDATE %s z SET %s WHERE %s;\n', target,
                (SELECT string_agg(format('%I = %s', c, CASE WHEN con.confdeltype = 'n' THEN 'NULL' ELSE 'DEFAULT' END), ', ')
                 FROM unnest(coalesce(con.delsetcols, con.cols)) AS c),
                cow._eq2(con.cols, 'z', con.refcols, 'OLD'));
        END IF;
        IF con.confupdtype IN ('r', 'a') OR NOT con.child_cow THEN
            -- (A NO ACTION key that moves with the primary key leaves a tombstone, checked at the end.)
            par_upd_check := par_upd_check || format(E'    IF %s AND %s%s THEN\n        %s\n    END IF;\n',
                                                     cow._changed(con.refcols),
                                                     CASE WHEN con.confupdtype = 'a' AND con.child_cow
                                                          THEN format('NOT %s AND ', cow._changed(pk)) ELSE '' END,
                                                     cond, upd_raise);
        ELSE
            par_upd_act := par_upd_act || format(E'    IF %s THEN\n        UPDATE %s z SET %s WHERE %s;\n    END IF;\n',
                cow._changed(con.refcols), target,
                (SELECT string_agg(format('%I = %s', con.cols[j], CASE con.confupdtype WHEN 'n' THEN 'NULL'
                                          WHEN 'd' THEN 'DEFAULT' ELSE format('NEW.%I', con.refcols[j]) END), ', ')
                 FROM generate_subscripts(con.cols, 1) AS j),
                cow._eq2(con.cols, 'z', con.refcols, 'OLD'));
        END IF;
    END LOOP;

    -- INSERT
    fn := format('cow_changes.%I', r.changes_table || '_ins');
    EXECUTE format(E'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                   'AS $body$\n%sBEGIN\n%s'
                   '    IF _s IS NULL THEN\n        INSERT INTO %s AS y (%s) %s VALUES (%s) RETURNING y.* INTO NEW;\n        RETURN NEW;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s%s%s%s    RETURN NEW;\nEND $body$',
                   fn, decl, dflt_ins, b, cow._collist(ncols), CASE WHEN has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END,
                   cow._collist(ncols, 'NEW.'), gen_code, nn_code, chk_code, uq_ins, '',
                   cow._rec_code(ch, b, names, pk, 'NEW', false, fk_all, mark_guc, 'NULL'));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_insert INSTEAD OF INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()', v, fn);
    -- UPDATE: a primary-key change is a delete of the old key and a write of the new one.
    fn := format('cow_changes.%I', r.changes_table || '_upd');
    EXECUTE format(E'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                   'AS $body$\n%sBEGIN\n%s'
                   '    IF _s IS NULL THEN\n        UPDATE %s AS y SET (%s) = ROW(%s) WHERE %s RETURNING y.* INTO NEW;\n        RETURN NEW;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s%s%s%s'
                   '    IF %s THEN\n%s    END IF;\n%s%s    RETURN NEW;\nEND $body$',
                   fn, decl, dflt_upd, b, cow._collist(setcols), cow._collist(setcols, 'NEW.'), cow._eq(pk, 'y', 'OLD'),
                   gen_code, nn_code, chk_code, uq_upd, '', par_upd_check,
                   cow._changed(pk),
                   -- A primary-key move remembers the base key it started from (commit applies it as an UPDATE).
                   cow._rec_code(ch, b, names, pk, 'OLD', true) || format(
                       E'    _morig := CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END;\n',
                       (SELECT string_agg(format('%L, OLD.%I', k, k), ', ') FROM unnest(pk) AS k)),
                   cow._rec_code(ch, b, names, pk, 'NEW', false, fk_changed, mark_guc,
                                 format('CASE WHEN %s THEN _morig WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END',
                                        cow._changed(pk),
                                        (SELECT string_agg(format('%L, NEW.%I', k, k), ', ') FROM unnest(pk) AS k))), par_upd_act);
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_update INSTEAD OF UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', v, fn);
    -- DELETE
    fn := format('cow_changes.%I', r.changes_table || '_del');
    EXECUTE format(E'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                   'AS $body$\n%sBEGIN\n'
                   '    IF _s IS NULL THEN\n        DELETE FROM %s AS y WHERE %s;\n        IF NOT FOUND THEN\n            RETURN NULL;\n        END IF;\n        RETURN OLD;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s    RETURN OLD;\nEND $body$',
                   fn, decl, b, cow._eq(pk, 'y', 'OLD'), par_del_check,
                   cow._rec_code(ch, b, names, pk, 'OLD', true), par_del_act);
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_delete INSTEAD OF DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', v, fn);
    -- Statement-level FOREIGN KEY checks (see above).
    IF fk_ins = '' THEN
        EXECUTE format('DROP TRIGGER IF EXISTS cow_fk_mark ON %s', v);
        EXECUTE format('DROP TRIGGER IF EXISTS cow_fk_check ON %s', v);
    ELSE
        fn := format('cow_changes.%I', r.changes_table || '_mark');
        EXECUTE format(E'CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger LANGUAGE plpgsql '
                       'AS $body$\nBEGIN\n'
                       '    IF nullif(current_setting(''cow.session_id'', true), '''') IS NOT NULL THEN\n'
                       '        PERFORM set_config(%2$L, concat_ws('','', nullif(current_setting(%2$L, true), ''''),\n'
                       '            (SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM cow.write_seq)::text), true);\n'
                       '    END IF;\n    RETURN NULL;\nEND $body$', fn, 'cow._mark_' || r.changes_table);
        EXECUTE format('CREATE OR REPLACE TRIGGER cow_fk_mark BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()', v, fn);
        fn := format('cow_changes.%I', r.changes_table || '_fkcheck');
        EXECUTE format(E'CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger LANGUAGE plpgsql '
                       'AS $body$\n'
                       'DECLARE\n    _s text := nullif(current_setting(''cow.session_id'', true), '''');\n'
                       '    _marks text := current_setting(%2$L, true);\n    _mark bigint;\n    _seq bigint;\n'
                       '    _det text;\n    _best bigint;\n    _bdet text;\n    _bcon text;\n    _bmsg text;\nBEGIN\n'
                       '    IF _s IS NULL OR coalesce(_marks, '''') = '''' THEN\n        RETURN NULL;\n    END IF;\n'
                       '    _mark := split_part(_marks, '','', -1)::bigint;\n'
                       '    PERFORM set_config(%2$L, regexp_replace(_marks, '',?[^,]*$'', ''''), true);\n%3$s'
                       '    IF _best IS NOT NULL THEN\n'
                       '        RAISE EXCEPTION USING ERRCODE = ''23503'', MESSAGE = _bmsg,\n'
                       '            DETAIL = _bdet, SCHEMA = %5$L, TABLE = %4$L, CONSTRAINT = _bcon;\n'
                       '    END IF;\n    RETURN NULL;\nEND $body$', fn, 'cow._mark_' || r.changes_table, fk_ins, tab, sch);
        EXECUTE format('CREATE OR REPLACE TRIGGER cow_fk_check AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()', v, fn);
    END IF;
    UPDATE cow.registry SET signature = cow._signature(rel) WHERE id = p_id;
END $gen$;

-- ---------------------------------------------------------------------------------------------------------
-- Enabling schemas and tables, keeping them in step with app DDL
-- ---------------------------------------------------------------------------------------------------------

-- Overlay twins of app views that read enabled tables: same definition, names resolving to the overlay first.
CREATE OR REPLACE FUNCTION cow._build_twins() RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
    enabled oid[];
    todo oid[];
    progress boolean := true;
    app_path text;
    twin_path text;
    def text;
    opts text;
BEGIN
    -- Drop the existing twins (everything in an overlay schema that is not a table's overlay view).
    FOR x IN SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND c.relkind = 'v'
               AND NOT EXISTS (SELECT 1 FROM cow.registry g WHERE g.overlay_schema = n.nspname AND g.table_name = c.relname)
    LOOP
        EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.nspname, x.relname);
    END LOOP;
    SELECT array_agg(relid) INTO enabled FROM cow.registry;
    enabled := coalesce(enabled, '{}');
    -- Views and materialized views of enabled schemas that read (transitively) an enabled table.
    SELECT array_agg(c.oid ORDER BY c.oid) INTO todo
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('v', 'm') AND n.nspname IN (SELECT schema_name FROM cow.schemas);
    todo := coalesce(todo, '{}');
    WHILE progress LOOP
        progress := false;
        FOR x IN SELECT c.oid, n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = ANY (todo) ORDER BY c.oid LOOP
            IF EXISTS (SELECT 1 FROM pg_rewrite rw JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = rw.oid
                       WHERE rw.ev_class = x.oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> x.oid
                         AND d.refobjid = ANY (enabled)) THEN
                todo := array_remove(todo, x.oid);
                progress := true;
                IF x.relkind = 'm' THEN
                    RETURN NEXT format('materialized view %I.%I reads CoW tables; it shows base rows only (no overlay twin)',
                                       x.nspname, x.relname);
                    CONTINUE;
                END IF;
                -- Print the definition with the app schemas on the path (their names come out bare), then
                -- create it with each overlay schema ahead of its app schema.
                SELECT string_agg(quote_ident(s), ', ' ORDER BY s <> x.nspname, s) INTO app_path
                FROM (SELECT schema_name AS s FROM cow.schemas) q;
                SELECT string_agg(format('%I, %I', overlay_schema, schema_name), ', ' ORDER BY schema_name <> x.nspname, schema_name)
                INTO twin_path FROM cow.schemas;
                PERFORM set_config('search_path', app_path, true);
                def := pg_get_viewdef(x.oid);
                PERFORM set_config('search_path', twin_path, true);
                SELECT coalesce(' WITH (' || array_to_string(c.reloptions, ', ') || ')', '') INTO opts
                FROM pg_class c WHERE c.oid = x.oid;
                EXECUTE format('CREATE VIEW %I.%I%s AS %s', cow._overlay_name(x.nspname), x.relname, opts, def);
                PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
                EXECUTE (SELECT string_agg(format('GRANT %s ON %I.%I TO %s', a.privilege_type, cow._overlay_name(x.nspname),
                                                  x.relname, CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                                                                  ELSE quote_ident(pg_get_userbyid(a.grantee)) END), '; ')
                         FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
                         WHERE c.oid = x.oid AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE'));
                enabled := enabled || x.oid;
            END IF;
        END LOOP;
    END LOOP;
END $gen$;

-- Register a table (no objects yet); returns a note when it cannot be enabled.
CREATE OR REPLACE FUNCTION cow._register(p_rel oid) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    sch text;
    tab text;
    new_id int;
BEGIN
    SELECT n.nspname, c.relname INTO sch, tab FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = p_rel;
    PERFORM cow._add_guard(p_rel);
    IF EXISTS (SELECT 1 FROM cow.registry WHERE relid = p_rel) THEN
        RETURN NULL;
    END IF;
    IF cow._pk_columns(p_rel) IS NULL THEN
        RETURN format('table %I.%I has no primary key: not enabled (it stays plain; writes to it in a session are refused)',
                      sch, tab);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = p_rel AND attnum > 0 AND NOT attisdropped
               AND attname LIKE '\_cow\_%') THEN
        RETURN format('table %I.%I has a column named _cow_*, reserved by the layer: not enabled', sch, tab);
    END IF;
    INSERT INTO cow.registry (relid, table_schema, table_name, overlay_schema, changes_table, pk_columns)
    VALUES (p_rel, sch, tab, cow._overlay_name(sch), 'pending_' || p_rel, '{}')
    RETURNING id INTO new_id;
    UPDATE cow.registry SET changes_table = 't' || new_id WHERE id = new_id;
    RETURN NULL;
END $gen$;

-- Bring every enabled schema in step: new tables enabled, dropped tables' overlays removed, changed tables
-- regenerated, guards present, view twins rebuilt. Returns notes (skipped tables, unsupported objects).
CREATE OR REPLACE FUNCTION cow.refresh(p_force boolean DEFAULT false) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
    note text;
    rebuilt boolean := p_force;
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    -- Tables that are gone, or moved out of the enabled schemas.
    FOR x IN SELECT g.* FROM cow.registry g
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                               JOIN cow.schemas s ON s.schema_name = n.nspname
                               WHERE c.oid = g.relid AND NOT c.relname = ANY (s.excluded)) LOOP
        EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.overlay_schema, x.table_name);
        EXECUTE format('DROP TABLE IF EXISTS cow_changes.%I CASCADE', x.changes_table);
        EXECUTE format('DROP FUNCTION IF EXISTS cow_changes.%I(), cow_changes.%I(), cow_changes.%I()',
                       x.changes_table || '_ins', x.changes_table || '_upd', x.changes_table || '_del');
        DELETE FROM cow.registry WHERE id = x.id;
        rebuilt := true;
    END LOOP;
    FOR x IN SELECT s.overlay_schema FROM cow.schemas s LOOP
        EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', x.overlay_schema);
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO PUBLIC', x.overlay_schema);
    END LOOP;
    -- Tables of enabled schemas (partitions get the guard only; their parent is enabled).
    FOR x IN SELECT c.oid, c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN cow.schemas s ON s.schema_name = n.nspname
             WHERE c.relkind IN ('r', 'p') AND NOT c.relname = ANY (s.excluded) ORDER BY n.nspname, c.relname LOOP
        IF x.relispartition THEN
            PERFORM cow._add_guard(x.oid);
        ELSE
            note := cow._register(x.oid);
            IF note IS NOT NULL THEN
                RETURN NEXT note;
            END IF;
        END IF;
    END LOOP;
    -- Views first (every trigger function reads other tables' overlay views), then the triggers.
    FOR x IN SELECT g.id, g.relid, g.signature, g.overlay_schema, g.table_name FROM cow.registry g ORDER BY g.id LOOP
        IF p_force OR x.signature IS DISTINCT FROM cow._signature(x.relid)
           OR to_regclass(format('%I.%I', x.overlay_schema, (SELECT relname FROM pg_class WHERE oid = x.relid))) IS NULL THEN
            PERFORM cow._build_view(x.id);
            rebuilt := true;
        END IF;
    END LOOP;
    IF rebuilt THEN
        FOR x IN SELECT g.id FROM cow.registry g ORDER BY g.id LOOP
            PERFORM cow._build_triggers(x.id);
        END LOOP;
    END IF;
    FOR note IN SELECT * FROM cow._build_twins() LOOP
        RETURN NEXT note;
    END LOOP;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

CREATE OR REPLACE FUNCTION cow.enable_schema(p_schema text, p_exclude text[] DEFAULT '{}') RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    t text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = p_schema) THEN
        RAISE EXCEPTION 'schema "%" does not exist', p_schema USING ERRCODE = 'invalid_schema_name';
    END IF;
    IF p_schema IN ('cow', 'cow_changes', 'pg_catalog', 'information_schema') OR p_schema LIKE 'cow\_overlay\_%'
       OR p_schema LIKE 'pg\_toast%' THEN
        RAISE EXCEPTION 'schema "%" cannot be enabled', p_schema USING ERRCODE = 'invalid_schema_name';
    END IF;
    FOREACH t IN ARRAY coalesce(p_exclude, '{}') LOOP
        IF to_regclass(format('%I.%I', p_schema, t)) IS NULL THEN
            RAISE EXCEPTION 'relation "%.%" does not exist (--exclude)', p_schema, t USING ERRCODE = 'undefined_table';
        END IF;
    END LOOP;
    INSERT INTO cow.schemas AS s (schema_name, overlay_schema, excluded)
    VALUES (p_schema, cow._overlay_name(p_schema), coalesce(p_exclude, '{}'))
    ON CONFLICT (schema_name) DO UPDATE
        SET excluded = ARRAY(SELECT DISTINCT e FROM unnest(s.excluded || EXCLUDED.excluded) AS e ORDER BY e);
    RETURN QUERY SELECT * FROM cow.refresh();
END $gen$;

-- Enable one table (its schema becomes enabled; the schema's other tables are enabled too).
CREATE OR REPLACE FUNCTION cow.enable_table(p_rel regclass) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    RETURN QUERY SELECT * FROM cow.enable_schema(
        (SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_rel));
END $gen$;

-- Event triggers: app DDL goes through; the overlay follows.
CREATE OR REPLACE FUNCTION cow._ddl_start() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    -- The overlay views depend on the base columns: drop them so that DROP COLUMN, ALTER COLUMN TYPE and
    -- DROP TABLE of the app are not blocked; ddl_command_end recreates them (the changes tables stay).
    IF tg_tag IN ('ALTER TABLE', 'DROP TABLE', 'DROP SCHEMA', 'ALTER SCHEMA', 'ALTER TYPE', 'DROP TYPE', 'ALTER DOMAIN',
                  'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION', 'DROP VIEW', 'ALTER VIEW',
                  'DROP MATERIALIZED VIEW', 'DROP COLLATION', 'DROP OWNED') THEN
        PERFORM set_config('cow.in_layer', 'on', true);
        FOR x IN SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND c.relkind = 'v' LOOP
            EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.nspname, x.relname);
        END LOOP;
        PERFORM set_config('cow.in_layer', '', true);
    END IF;
END $gen$;

CREATE OR REPLACE FUNCTION cow._ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    note text;
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    IF tg_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'DROP TABLE', 'CREATE INDEX',
                  'DROP INDEX', 'ALTER INDEX', 'CREATE SCHEMA', 'DROP SCHEMA', 'ALTER SCHEMA', 'ALTER TYPE',
                  'DROP TYPE', 'ALTER DOMAIN', 'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION', 'CREATE VIEW',
                  'ALTER VIEW', 'DROP VIEW', 'CREATE MATERIALIZED VIEW', 'DROP MATERIALIZED VIEW', 'GRANT',
                  'REVOKE', 'DROP COLLATION', 'DROP OWNED', 'ALTER DEFAULT PRIVILEGES', 'COMMENT') THEN
        FOR note IN SELECT * FROM cow.refresh() LOOP
            RAISE NOTICE 'cowproxy: %', note;
        END LOOP;
    END IF;
END $gen$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_start') THEN
        CREATE EVENT TRIGGER cow_ddl_start ON ddl_command_start EXECUTE FUNCTION cow._ddl_start();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_end') THEN
        CREATE EVENT TRIGGER cow_ddl_end ON ddl_command_end EXECUTE FUNCTION cow._ddl_end();
    END IF;
END $$;

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

-- The session's write log, one row per row written, in write order.
CREATE OR REPLACE FUNCTION cow.session_changes(session text)
RETURNS TABLE (seq bigint, operation_id text, table_schema text, table_name text, pk jsonb, row_data jsonb,
               deleted boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    q text;
BEGIN
    PERFORM cow._check_id(coalesce(session, ''), 'session');
    SELECT string_agg(format(
        'SELECT c._cow_seq, c._cow_op, %L::text, %L::text, jsonb_build_object(%s), '
        'CASE WHEN c._cow_deleted THEN NULL ELSE to_jsonb(c) - cow._meta_columns() END, c._cow_deleted '
        'FROM cow_changes.%I c WHERE c._cow_session = $1',
        g.table_schema, g.table_name,
        (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k), g.changes_table),
        ' UNION ALL ')
    INTO q FROM cow.registry g;
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
    SELECT string_agg(format(
        'SELECT %L::text, %L::text, jsonb_build_object(%s), c._cow_deleted, c._cow_base, '
        'CASE WHEN c._cow_deleted THEN NULL ELSE to_jsonb(c) - cow._meta_columns() END, c._cow_seq, c._cow_op '
        'FROM cow_changes.%I c WHERE c._cow_session = $1 AND c._cow_current',
        g.table_schema, g.table_name,
        (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k), g.changes_table),
        ' UNION ALL ')
    INTO q FROM cow.registry g;
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
    SELECT string_agg(format(
        'SELECT DISTINCT ON (%3$s) %1$L::text, %2$L::text, jsonb_build_object(%4$s), c._cow_base '
        'FROM cow_changes.%5$I c WHERE c._cow_session = $1',
        g.table_schema, g.table_name, cow._collist(g.pk_columns, 'c.'),
        (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k), g.changes_table),
        ' UNION ALL ')
    INTO q FROM cow.registry g;
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
BEGIN
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
        sel := format('(SELECT DISTINCT ON (%s) c.* FROM cow_changes.%I c WHERE c._cow_session = $1 '
                      'AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) ORDER BY %s, c._cow_seq DESC)',
                      cow._collist(g.pk_columns, 'c.'), g.changes_table, cow._collist(g.pk_columns, 'c.'));
        pkeq := cow._eq(g.pk_columns, 'b', 'c');
        IF on_conflict = 'fail' THEN
            EXECUTE format('SELECT format(''(%s)=(%%s)'', %s) FROM %s c LEFT JOIN %I.%I b ON %s '
                           'WHERE (CASE WHEN b.%I IS NULL THEN NULL ELSE to_jsonb(b) END) IS DISTINCT FROM c._cow_base LIMIT 1',
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
    -- Deletes, children first.
    FOR i IN REVERSE coalesce(array_length(ord, 1), 0) .. 1 LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        sel := format('(SELECT DISTINCT ON (%s) c.* FROM cow_changes.%I c WHERE c._cow_session = $1 '
                      'AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) ORDER BY %s, c._cow_seq DESC)',
                      cow._collist(g.pk_columns, 'c.'), g.changes_table, cow._collist(g.pk_columns, 'c.'));
        -- Deleted keys, and keys a moved row takes over (the session deleted their base row first). The old
        -- key of a primary-key move is not deleted: the move is applied as an UPDATE below, so that the
        -- base's ON DELETE actions never fire on rows the session did not touch.
        EXECUTE format('DELETE FROM %1$I.%2$I b USING %3$s c WHERE %4$s '
                       'AND (c._cow_deleted OR (c._cow_origin IS NOT NULL AND c._cow_origin <> jsonb_build_object(%5$s))) '
                       'AND NOT EXISTS (SELECT 1 FROM %3$s m WHERE NOT m._cow_deleted AND m._cow_origin = jsonb_build_object(%5$s) '
                       'AND m._cow_origin <> jsonb_build_object(%6$s))',
                       g.table_schema, g.table_name, sel, cow._eq(g.pk_columns, 'b', 'c'),
                       (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k),
                       (SELECT string_agg(format('%L, m.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k))
        USING session, chosen;
        GET DIAGNOSTICS n = ROW_COUNT;
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name],
                             jsonb_build_object('inserted', 0, 'updated', 0, 'deleted', n));
    END LOOP;
    -- Inserts and updates, parents first, rows in write order.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
        sel := format('(SELECT DISTINCT ON (%s) c.* FROM cow_changes.%I c WHERE c._cow_session = $1 '
                      'AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) ORDER BY %s, c._cow_seq DESC)',
                      cow._collist(g.pk_columns, 'c.'), g.changes_table, cow._collist(g.pk_columns, 'c.'));
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
                           (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k),
                           cow._eq(g.pk_columns, 'b2', 'c'))
            USING session, chosen;
            GET DIAGNOSTICS n = ROW_COUNT;
            EXIT WHEN n = 0;
            moved := moved + n;
        END LOOP;
        EXECUTE format('DELETE FROM %I.%I b USING %s c WHERE c._cow_deleted AND %s', g.table_schema, g.table_name,
                       sel, cow._eq(g.pk_columns, 'b', 'c'))
        USING session, chosen;
        GET DIAGNOSTICS n = ROW_COUNT;
        stats := jsonb_set(stats, '{deleted}', to_jsonb((stats ->> 'deleted')::bigint + n));
        -- Updates, then inserts, in one statement: PostgreSQL checks foreign keys at the end of a statement,
        -- so an updated row may reference a row inserted here (a self-referencing table) and the other way
        -- round. The INSERT reads u's count first, so the updates (which may free UNIQUE values) run first.
        EXECUTE format('WITH u AS (%s), i AS (INSERT INTO %I.%I (%s) %s SELECT %s FROM %s c WHERE NOT c._cow_deleted '
                       'AND (SELECT count(*) FROM u) >= 0 '
                       'AND NOT EXISTS (SELECT 1 FROM %I.%I b WHERE %s) ORDER BY c._cow_seq RETURNING 1) '
                       'SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM i)',
                       CASE WHEN setcols IS NULL THEN 'SELECT 1 WHERE false'
                            ELSE format('UPDATE %I.%I b SET (%s) = ROW(%s) FROM %s c WHERE NOT c._cow_deleted AND %s RETURNING 1',
                                        g.table_schema, g.table_name, cow._collist(setcols), cow._collist(setcols, 'c.'),
                                        sel, pkeq) END,
                       g.table_schema, g.table_name, cow._collist(ncols),
                       CASE WHEN has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END, cow._collist(ncols, 'c.'),
                       sel, g.table_schema, g.table_name, pkeq)
        INTO m, n USING session, chosen;
        -- moved rows included (without non-key columns, the moves are all the updates)
        stats := jsonb_set(stats, '{updated}', to_jsonb(CASE WHEN setcols IS NULL THEN moved ELSE m END));
        -- Rows the session wrote and that already existed count as updated (the UPDATE above), the rest inserted.
        stats := jsonb_set(stats, '{inserted}', to_jsonb(n));
        summary := jsonb_set(summary, ARRAY[g.table_schema || '.' || g.table_name], stats);
    END LOOP;
    -- Drop what was applied; later writes of other operations stay, now based on the new base rows.
    FOR i IN 1 .. coalesce(array_length(ord, 1), 0) LOOP
        SELECT * INTO g FROM cow.registry WHERE id = ord[i];
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
                           (SELECT string_agg(format('%L, c.%I', k, k), ', ') FROM unnest(g.pk_columns) AS k))
            USING session, chosen;
            EXECUTE format('DELETE FROM cow_changes.%I WHERE _cow_session = $1 AND _cow_op = ANY ($2)', g.changes_table)
            USING session, chosen;
            EXECUTE format('UPDATE cow_changes.%1$I c SET _cow_base = (SELECT to_jsonb(b) FROM %2$I.%3$I b WHERE %4$s) '
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

-- Remove every layer object except schema cow itself (the caller drops it): guards, overlays, changes, event
-- triggers. Refuses while sessions hold changes, unless p_discard.
CREATE OR REPLACE FUNCTION cow._teardown(p_discard boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    x record;
    n bigint;
    holders text[] := '{}';
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    FOR x IN SELECT changes_table FROM cow.registry LOOP
        IF to_regclass(format('cow_changes.%I', x.changes_table)) IS NOT NULL THEN
            EXECUTE format('SELECT array_agg(DISTINCT _cow_session) FROM cow_changes.%I', x.changes_table) INTO STRICT holders;
            IF holders IS NOT NULL AND NOT p_discard THEN
                RAISE EXCEPTION 'sessions hold changes: % (discard or commit them, or uninstall with --discard-sessions)',
                    array_to_string(holders, ', ') USING ERRCODE = 'object_not_in_prerequisite_state';
            END IF;
        END IF;
    END LOOP;
    DROP EVENT TRIGGER IF EXISTS cow_ddl_start;
    DROP EVENT TRIGGER IF EXISTS cow_ddl_end;
    FOR x IN SELECT tgrelid::regclass AS rel FROM pg_trigger WHERE tgname = 'cow_guard'
             AND tgfoid = 'cow.guard()'::regprocedure LOOP
        EXECUTE format('DROP TRIGGER cow_guard ON %s', x.rel);
    END LOOP;
    FOR x IN SELECT overlay_schema FROM cow.schemas LOOP
        EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', x.overlay_schema);
    END LOOP;
    DROP SCHEMA IF EXISTS cow_changes CASCADE;
    GET DIAGNOSTICS n = ROW_COUNT;
END $$;
