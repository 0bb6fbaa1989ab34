-- cowproxy copy-on-write layer: session GUCs, the base tables' guard, code generation helpers.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- ---------------------------------------------------------------------------------------------------------
-- Session GUCs
-- ---------------------------------------------------------------------------------------------------------

-- ('+' and a length test: the bounded repetition '{1,128}' is the same rule, but PostgreSQL's regex engine
-- unrolls it, ~25x dearer per value and compiled again in every new backend; migration 54.)
CREATE OR REPLACE FUNCTION cow.valid_id(p text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT p ~ '^[A-Za-z0-9._:-]+$' AND length(p) <= 128 $$;

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

-- (cow.current_session() is in 11_binding.sql: a bound backend's session comes from its binding.)

-- search_path entries, unquoted, in order. A path of ASCII letters, digits, '_', '$', commas, spaces and
-- "$user" (the usual one) is split by an expression: its entries are what lies between commas without the
-- spaces (an unquoted entry has none inside), as the regex finds them; any other path by the regex.
-- plpgsql, so that a backend compiles it and plans its expressions once (the join and then the proxy's path
-- probe call it in each new backend: as a SQL function its query was parsed and planned at every call, ~2 M
-- instructions of a join; docs/benchmarks.md, "The join in a new backend").
CREATE OR REPLACE FUNCTION cow._path_entries(p text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF translate(replace(p, '"$user"', ''), 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$, ', '') = '' THEN
        RETURN array_remove(string_to_array(replace(replace(p, '"$user"', '$user'), ' ', ''), ','), '');
    END IF;
    RETURN (SELECT coalesce(array_agg(CASE WHEN m[1] IS NOT NULL THEN replace(m[1], '""', '"') ELSE btrim(m[2]) END
                                      ORDER BY ord), '{}')
            FROM regexp_matches(coalesce(p, ''), '\s*(?:"((?:[^"]|"")*)"|([^,]+))\s*(?:,|$)', 'g') WITH ORDINALITY AS t(m, ord)
            WHERE coalesce(m[1], btrim(m[2])) <> '');
END $$;

CREATE OR REPLACE FUNCTION cow._path_text(entries text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(CASE WHEN e = '$user' THEN '"$user"' ELSE quote_ident(e) END, ', ' ORDER BY ord), '')
    FROM unnest(entries) WITH ORDINALITY AS t(e, ord)
$$;

-- The search_path without overlay schemas, then (when joining) the overlay path of it (cow._overlay_path in
-- 12_app_path.sql: each enabled schema's overlay right before it; a path without an enabled schema gets none).
CREATE OR REPLACE FUNCTION cow._session_path(p_join boolean) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    app text := current_setting('search_path');
BEGIN
    IF cardinality(cow._app_path_entries(app)) <> cardinality(cow._path_entries(app)) THEN
        app := cow._path_text(cow._app_path_entries(app));  -- (else as the application wrote it)
    END IF;
    RETURN CASE WHEN p_join THEN cow._overlay_path(app) ELSE app END;
END $$;

-- Put session and operation in force for the rest of the connection (cow.use_session, cow.bind_session):
-- the GUCs, and the overlay path first in search_path. NULL session: leave the session. A join is the first
-- statement of each new tagged connection, where every statement of a function is parsed and planned for its
-- one run and every function it calls is compiled (docs/benchmarks.md, "The join in a new backend"): so one
-- loop drops the overlay schemas the path names and builds the overlay path (as cow._app_entries and
-- cow._overlay_path_of do), with one query per entry, and the four settings are one expression.
CREATE OR REPLACE FUNCTION cow._join(session text, operation text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    app text := current_setting('search_path');
    entries text[] := cow._path_entries(app);
    e text;
    ov text;
    dropped boolean := false;
    kept text := '';  -- the entries without overlay schemas, as a path
    overlays text[] := '{}';
    overlay_path text := '';
    done text;  -- (set_config's result: an assignment is a simple expression, a PERFORM runs the executor)
BEGIN
    FOREACH e IN ARRAY entries LOOP
        -- (Overlay schemas are named cow_overlay_... (cow._overlay_name): the query that asks whether an
        -- entry is one is planned only for an entry so named.)
        IF starts_with(e, 'cow_overlay_') THEN
            IF EXISTS (SELECT 1 FROM cow.schemas o WHERE o.overlay_schema = e) THEN
                dropped := true;
                CONTINUE;
            END IF;
        END IF;
        SELECT s.overlay_schema INTO ov FROM cow.schemas s
        WHERE s.schema_name = CASE WHEN e = '$user' THEN current_user::text ELSE e END;
        IF ov IS NOT NULL AND NOT ov = ANY (overlays) THEN
            overlays := overlays || ov;
            overlay_path := overlay_path || ', ' || quote_ident(ov);
        END IF;
        e := CASE WHEN e = '$user' THEN '"$user"' ELSE quote_ident(e) END;
        kept := kept || ', ' || e;
        overlay_path := overlay_path || ', ' || e;
    END LOOP;
    IF dropped THEN
        app := substr(kept, 3);  -- (else as the application wrote it)
    END IF;
    -- (concat evaluates its arguments in order.) The application's own path goes to cow.app_search_path,
    -- which introspection presents (12_app_path.sql).
    done := concat(set_config('cow.session_id', coalesce(session, ''), false),
                   set_config('cow.operation_id', CASE WHEN session IS NULL THEN '' ELSE coalesce(operation, '') END,
                              false),
                   set_config('cow.app_search_path', CASE WHEN session IS NULL THEN '' ELSE app END, false),
                   set_config('search_path', CASE WHEN session IS NULL THEN app ELSE substr(overlay_path, 3) END,
                              false));
    RETURN session;
END $$;

-- The no-proxy path: a trusted client joins a session by setting the GUCs (docs/threat-model.md: nothing
-- stops SQL on the connection from changing them again). A backend bound by cow.bind_session may only
-- re-join its own session (to switch the operation); leaving or switching it needs the binding secret. A
-- backend without a temporary schema was never bound (cow._session): its binding is not looked up.
CREATE OR REPLACE FUNCTION cow.use_session(session text, operation text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    bound text;
BEGIN
    session := nullif(session, '');
    operation := nullif(operation, '');
    IF NOT coalesce(cow.valid_id(session), true) OR NOT coalesce(cow.valid_id(operation), true) THEN
        PERFORM cow._check_id(session, 'session');  -- (raises)
        PERFORM cow._check_id(operation, 'operation');
    END IF;
    IF pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.<>) 0::pg_catalog.oid THEN
        bound := cow._bound();
        IF bound IS NOT NULL AND NOT coalesce(session OPERATOR(pg_catalog.=) bound, false) THEN
            RAISE EXCEPTION 'cowproxy: use_session(%) refused: this connection is bound to session %',
                coalesce(quote_literal(session), 'NULL'), bound
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Only cow.bind_session with the binding secret changes the session of a bound connection.';
        END IF;
    END IF;
    RETURN cow._join(session, operation);
END $$;

CREATE OR REPLACE FUNCTION cow.use_operation(operation text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    operation := nullif(operation, '');
    PERFORM cow._check_id(operation, 'operation');
    PERFORM set_config('cow.operation_id', coalesce(operation, ''), false);
    RETURN operation;
END $$;

-- The registry check's stamp: what it was valid for. The generated triggers skip the check while the stamp
-- that cow._write_session left in `cow._open` (for the rest of the connection) equals this: the same session
-- and operation ids (validated then), no session closed since (cow.session_closes, bumped by the trigger on
-- cow.sessions below, also for closes by other connections) and the same second of transaction start (so
-- last_write_at is refreshed about once a second). One inlined expression, no query: the check's lookup,
-- when it ran in every autocommit write, was ~20-35 us of a ~150 us write (docs/benchmarks.md).
-- (Ids containing '/' are invalid, so a stamp cannot be forged from an unchecked id.)
CREATE OR REPLACE FUNCTION cow._open_stamp(s text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT s || '/' || coalesce(pg_catalog.current_setting('cow.operation_id', true), '') || '/'
           || coalesce(pg_catalog.pg_sequence_last_value('cow.session_closes'::pg_catalog.regclass), 0)::text || '/'
           || pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now()))::int8::text
$$;

-- The registry check of the generated triggers, when the stamp (above) does not match: the current session
-- (NULL: none), with the ids validated, the session registered if new, refused if not open, last_write_at
-- refreshed if older than a second. SECURITY DEFINER: only the layer's owner may write cow.sessions.
CREATE OR REPLACE FUNCTION cow._write_session() RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s text := cow._session();
    stamp text;
    st text;
    lw timestamptz;
    keep boolean;
BEGIN
    IF s IS NULL THEN
        RETURN NULL;
    END IF;
    -- (Read before the registry row: a close that bumps the counter after this read is seen next time.)
    stamp := cow._open_stamp(s);
    IF current_setting('cow._open', true) IS DISTINCT FROM stamp THEN
        -- Ids set with SET or startup options did not go through cow.use_session: check them here.
        IF NOT cow.valid_id(s)
           OR NOT coalesce(cow.valid_id(nullif(current_setting('cow.operation_id', true), '')), true) THEN
            PERFORM cow._check_id(s, 'session');
            PERFORM cow._check_id(nullif(current_setting('cow.operation_id', true), ''), 'operation');
        END IF;
        -- The stamp may include a counter a close in progress has already bumped (commit_session,
        -- discard_session, a status UPDATE or a DELETE hold the row when they bump it): then the status read
        -- is the one before the close, and keeping it for the connection would let writes pass after the
        -- close commits. So it is kept only when the row could be locked FOR SHARE (no close holds it, and
        -- none can take it before this transaction ends); when another transaction holds the row (a close,
        -- or one updating the timestamps), it is read without a lock, as a check for this transaction only,
        -- and nothing waits: concurrent transactions of one session (a pooled application) do not queue
        -- behind each other. A new session is inserted (ON CONFLICT DO NOTHING); an existing one gets its
        -- timestamps only when no other transaction holds its row (SKIP LOCKED), so last_write_at is
        -- approximate under concurrency.
        SELECT x.status, x.last_write_at INTO st, lw FROM cow.sessions x WHERE x.session_id = s
        FOR SHARE SKIP LOCKED;
        keep := FOUND;
        IF NOT keep THEN
            SELECT x.status, x.last_write_at INTO st, lw FROM cow.sessions x WHERE x.session_id = s;
            IF st IS NULL THEN
                -- (A row this transaction inserted is held as FOR SHARE would hold it: no other transaction
                -- sees it before this one ends. So it is kept without reading it again.)
                INSERT INTO cow.sessions AS x (session_id, kind, first_write_at, last_write_at)
                VALUES (s, 'other', now(), now())
                ON CONFLICT (session_id) DO NOTHING
                RETURNING x.status, x.last_write_at INTO st, lw;
                keep := FOUND;
                IF NOT keep THEN
                    SELECT x.status, x.last_write_at INTO st, lw FROM cow.sessions x WHERE x.session_id = s
                    FOR SHARE SKIP LOCKED;
                    keep := FOUND;
                END IF;
                IF NOT keep THEN
                    SELECT x.status, x.last_write_at INTO st, lw FROM cow.sessions x WHERE x.session_id = s;
                END IF;
            END IF;
        END IF;
        IF lw IS NULL OR lw < now() - interval '1 second' THEN
            -- (At most about once a second: a registry update per transaction would double a write's cost.)
            UPDATE cow.sessions x SET last_write_at = now(), first_write_at = coalesce(x.first_write_at, now())
            WHERE x.session_id = (SELECT y.session_id FROM cow.sessions y WHERE y.session_id = s
                                  FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
        IF st <> 'open' THEN
            RAISE EXCEPTION 'session % is %: it takes no more writes', s, st
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF keep THEN
            -- For the rest of the connection (a rollback takes it back with the transaction).
            stamp := set_config('cow._open', stamp, false);  -- (an assignment: no executor run)
        END IF;
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

-- Refuses a write on a base table of an enabled schema from a connection in a session: tagged by the GUC, or
-- bound (cow._bound(), whatever the GUC says). ENABLE ALWAYS: session_replication_role = replica does not
-- skip it. Its argument is its version: cow._add_guard replaces a guard of an older one.
CREATE OR REPLACE FUNCTION cow.guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s text := coalesce(cow._bound(), nullif(current_setting('cow.session_id', true), ''));
BEGIN
    IF s IS NOT NULL THEN
        RAISE EXCEPTION 'cowproxy: % on base table %.% refused: the connection is in session % (write through the overlay view, or leave the session with cow.use_session(NULL))',
            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), s
            USING ERRCODE = 'insufficient_privilege', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
    END IF;
    RETURN NULL;
END $$;

-- Whether guard trigger t is the current one (cow.guard).
CREATE OR REPLACE FUNCTION cow._guard_current(t pg_catalog.pg_trigger) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT t.tgname = 'cow_guard' AND t.tgnargs = 1 AND t.tgargs = '\x3300'::bytea AND t.tgenabled = 'A'
$$;

CREATE OR REPLACE FUNCTION cow._add_guard(p_rel oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The WHEN clause keeps untagged writes from calling plpgsql for the guard itself, and from asking
    -- cow._bound() unless the backend has a temporary schema (a builtin's answer): binding makes one
    -- (cow._bind), and a backend keeps it until it ends, so a bound backend is always asked.
    IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = p_rel AND cow._guard_current(t)) THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER cow_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                       'FOR EACH STATEMENT WHEN (pg_catalog.current_setting(''cow.session_id'', true) <> '''' '
                       'OR (pg_catalog.pg_my_temp_schema() <> 0 AND cow._bound() IS NOT NULL)) '
                       'EXECUTE FUNCTION cow.guard(''3'')', p_rel::regclass);
        EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER cow_guard', p_rel::regclass);
    END IF;
END $$;

-- ---------------------------------------------------------------------------------------------------------
-- Code generation helpers
-- ---------------------------------------------------------------------------------------------------------

-- A template with named slots, as the generators write their SQL: `{{name}}` is the slot's value as it is
-- (generated code), `{{name|I}}` the value quoted as an identifier (quote_ident, as format's %I), `{{name|L}}`
-- as a literal (quote_nullable, as format's %L: NULL stays NULL). A slot `slots` has no value for is an error,
-- not an empty string. Only the template is scanned: a value's own text is never read for slots.
CREATE OR REPLACE FUNCTION cow._fill(template text, slots jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    parts text[] := string_to_array(template, '{{');
    filled text := parts[1];
    part text;
    stop int;
    slot text[];
    value text;
BEGIN
    FOREACH part IN ARRAY parts[2:] LOOP
        stop := strpos(part, '}}');
        slot := regexp_match(left(part, stop - 1), '^([a-z_][a-z0-9_]*)(?:\|([IL]))?$');
        IF stop = 0 OR slot IS NULL THEN
            RAISE EXCEPTION 'cow._fill: a malformed slot in the template at {{%', left(part, 40);
        END IF;
        IF NOT slots ? slot[1] THEN
            RAISE EXCEPTION 'cow._fill: no value for slot {{%}}', slot[1];
        END IF;
        value := slots ->> slot[1];
        filled := filled || CASE slot[2] WHEN 'I' THEN quote_ident(value) WHEN 'L' THEN quote_nullable(value)
                                         ELSE coalesce(value, '') END
                         || substr(part, stop + 2);
    END LOOP;
    RETURN filled;
END $$;

-- (The string helpers below are plpgsql loops over simple expressions: as SQL functions, which PostgreSQL
-- cannot inline (an aggregate over unnest), each call parsed and planned its query again: ~100 calls per
-- table, a fifth of install's CPU. Like string_agg, a helper returns NULL for no columns unless it says.)

-- "a.x = b.x AND a.y = b.y" over cols.
CREATE OR REPLACE FUNCTION cow._eq(cols text[], l text, r text, l_cols text[] DEFAULT NULL) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    res text;
BEGIN
    FOR i IN coalesce(array_lower(cols, 1), 1) .. coalesce(array_upper(cols, 1), 0) LOOP
        res := concat_ws(' AND ', res, format('%s.%I = %s.%I', l, coalesce(l_cols[i], cols[i]), r, cols[i]));
    END LOOP;
    RETURN res;
END $$;

-- "r.x IS NOT NULL AND r.y IS NOT NULL"
CREATE OR REPLACE FUNCTION cow._notnull(cols text[], r text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c text;
    res text;
BEGIN
    FOREACH c IN ARRAY coalesce(cols, '{}') LOOP
        res := concat_ws(' AND ', res, format('%s.%I IS NOT NULL', r, c));
    END LOOP;
    RETURN res;
END $$;

-- "r.x IS NULL AND r.y IS NULL"
CREATE OR REPLACE FUNCTION cow._allnull(cols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT string_agg(format('%s.%I IS NULL', r, c), ' AND ') FROM unnest(cols) AS c
$$;

-- "(NEW.x IS DISTINCT FROM OLD.x OR ...)"
CREATE OR REPLACE FUNCTION cow._changed(cols text[]) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c text;
    res text;
BEGIN
    FOREACH c IN ARRAY coalesce(cols, '{}') LOOP
        res := concat_ws(' OR ', res, format('NEW.%I IS DISTINCT FROM OLD.%I', c, c));
    END LOOP;
    RETURN '(' || res || ')';
END $$;

-- "concat_ws(', ', coalesce(r.x::text, 'null'), ...)": key values for error details.
CREATE OR REPLACE FUNCTION cow._keytext(cols text[], r text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c text;
    res text;
BEGIN
    FOREACH c IN ARRAY coalesce(cols, '{}') LOOP
        res := concat_ws(', ', res, format('coalesce(%s.%I::text, ''null'')', r, c));
    END LOOP;
    RETURN 'concat_ws('', '', ' || res || ')';
END $$;

-- "'x', r.x, 'y', r.y": the arguments of jsonb_build_object for a key (or NULL without columns).
CREATE OR REPLACE FUNCTION cow._jsonargs(cols text[], r text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c text;
    res text;
BEGIN
    FOREACH c IN ARRAY coalesce(cols, '{}') LOOP
        res := concat_ws(', ', res, format('%L, %s.%I', c, r, c));
    END LOOP;
    RETURN res;
END $$;

-- "p.x, p.y" (prefix p.), '' without columns.
CREATE OR REPLACE FUNCTION cow._collist(cols text[], prefix text DEFAULT '') RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    c text;
    res text;
BEGIN
    FOREACH c IN ARRAY coalesce(cols, '{}') LOOP
        res := concat_ws(', ', res, prefix || quote_ident(c));
    END LOOP;
    RETURN coalesce(res, '');
END $$;

-- (The catalog helpers the generators call most, cow._attnames, cow._key_index, cow._pk_columns and
-- cow._signature, are plpgsql: it keeps their query plans for the session, where a SQL function that cannot
-- be inlined planned its query at every call, ~0.1-1 ms, a dozen calls per table and app DDL statement.)
CREATE OR REPLACE FUNCTION cow._attnames(p_rel oid, p_nums int2[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT array_agg(a.attname::text ORDER BY k.i)
            FROM unnest(p_nums) WITH ORDINALITY AS k(n, i)
            JOIN pg_catalog.pg_attribute a ON a.attrelid = p_rel AND a.attnum = k.n);
END $$;

CREATE OR REPLACE FUNCTION cow._overlay_name(p_schema text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length('cow_overlay_' || p_schema) <= 63 THEN 'cow_overlay_' || p_schema
                ELSE 'cow_overlay_' || left(p_schema, 40) || '_' || left(md5(p_schema), 8) END
$$;

-- The relation rows are read from in a session: the overlay view of an enabled table, else the table itself.
-- (plpgsql: its query planned once per connection, not at each of its ~10 calls per table.)
CREATE OR REPLACE FUNCTION cow._session_rel(p_rel oid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT format('%I.%I', overlay_schema, table_name) FROM cow.registry WHERE relid = p_rel),
                    p_rel::regclass::text);
END $$;

-- The index that identifies a table's rows in the layer, its "key" (registry.pk_columns holds its columns, so the
-- overlay view, the changes table's <t>_cur, commit, diff and scoring follow it): the primary key; else, like
-- PostgreSQL's logical replication, the index chosen by REPLICA IDENTITY USING INDEX; else the unique index with
-- the lowest oid that PostgreSQL would accept as a replica identity: valid, unique (not an exclusion index),
-- immediate (not DEFERRABLE), not partial, without expressions, every key column NOT NULL. NULL: none, the
-- table stays plain (cow._register says why). cow._signature covers the choice, so a change regenerates.
CREATE OR REPLACE FUNCTION cow._key_index(p_rel oid) RETURNS oid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT i.indexrelid FROM pg_index i
            WHERE i.indrelid = p_rel
              AND (i.indisprimary
                   OR (i.indisvalid AND i.indisunique AND NOT i.indisexclusion AND i.indimmediate AND i.indpred IS NULL
                       AND i.indexprs IS NULL
                       AND NOT EXISTS (SELECT 1 FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) AS k(n)
                                       LEFT JOIN pg_attribute a ON a.attrelid = p_rel AND a.attnum = k.n
                                       WHERE a.attnotnull IS NOT TRUE)))
            ORDER BY i.indisprimary DESC, i.indisreplident DESC, i.indexrelid
            LIMIT 1);
END $$;

-- Why no unique index of p_rel qualifies as its key (cow._key_index), for the notice of a table left plain:
-- "t_a_key (column a is nullable), t_b_idx (partial)", or NULL without unique indexes.
CREATE OR REPLACE FUNCTION cow._key_rejects(p_rel oid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT string_agg(format('%I (%s)', ic.relname, concat_ws(', ',
               CASE WHEN NOT i.indisvalid THEN 'invalid' END,
               CASE WHEN i.indisexclusion THEN 'an exclusion index' END,
               CASE WHEN NOT i.indimmediate THEN 'deferrable' END,
               CASE WHEN i.indpred IS NOT NULL THEN 'partial' END,
               CASE WHEN i.indexprs IS NOT NULL THEN 'on expressions' END,
               (SELECT string_agg(format('column %I is nullable', a.attname), ', ' ORDER BY k.o)
                FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) WITH ORDINALITY AS k(n, o)
                JOIN pg_attribute a ON a.attrelid = p_rel AND a.attnum = k.n
                WHERE NOT a.attnotnull))), ', ' ORDER BY i.indexrelid)
    FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
    WHERE i.indrelid = p_rel AND i.indisunique
$$;

-- The key's columns (the key index's key columns, without INCLUDE ones), NULL without a key.
CREATE OR REPLACE FUNCTION cow._pk_columns(p_rel oid) RETURNS text[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k oid := cow._key_index(p_rel);
BEGIN
    RETURN (SELECT cow._attnames(p_rel, (i.indkey::int2[])[0:i.indnkeyatts - 1]) FROM pg_index i WHERE i.indexrelid = k);
END $$;

-- The FOREIGN KEY constraints that reference table p_rel (pg_constraint.confrelid = p_rel), found through
-- pg_depend's index (a foreign key depends on the referenced columns): pg_constraint has no index on
-- confrelid, and a scan of it per table made install and app DDL quadratic in the number of tables (PostgreSQL
-- 18 keeps NOT NULL constraints there too: ~10 rows per enabled table).
CREATE OR REPLACE FUNCTION cow._fks_to(p_rel oid) RETURNS SETOF oid
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT k.oid FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_constraint k ON k.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass
      AND d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = p_rel
      AND k.contype = 'f' AND k.confrelid = p_rel
$$;

-- A fingerprint of everything the generated objects depend on: when it changes, regenerate.
-- (A generic plan: the custom plans plpgsql kept choosing for its parameter cost ~3.5 ms to make at every call,
-- ten times the query's run time.)
CREATE OR REPLACE FUNCTION cow._signature(p_rel oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN md5(concat_ws('|',
        p_rel::regclass::text,
        (SELECT string_agg(concat_ws(':', a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                     a.attgenerated, a.attidentity, pg_get_expr(d.adbin, d.adrelid)), ',' ORDER BY a.attnum)
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped),
        (SELECT string_agg(c.conname || pg_get_constraintdef(c.oid) || c.conrelid::regclass::text
                           || cow._session_rel(c.conrelid) || cow._session_rel(c.confrelid), ',' ORDER BY c.conname, c.oid)
         FROM pg_constraint c
         WHERE c.oid IN (SELECT k.oid FROM pg_constraint k WHERE k.conrelid = p_rel UNION SELECT f.oid FROM cow._fks_to(p_rel) AS f(oid))),
        (SELECT string_agg(pg_get_indexdef(i.indexrelid), ',' ORDER BY i.indexrelid)
         FROM pg_index i WHERE i.indrelid = p_rel AND i.indisunique),
        -- The key's choice (REPLICA IDENTITY, a NOT NULL dropped, a primary key added: cow._key_index).
        cow._key_index(p_rel)::regclass::text,
        (SELECT string_agg(coalesce(c.relacl::text, ''), ',') FROM pg_class c WHERE c.oid = p_rel),
        (SELECT string_agg(pg_get_partition_constraintdef(t.relid), ',' ORDER BY t.relid)
         FROM pg_partition_tree(p_rel) t WHERE t.isleaf AND t.relid <> p_rel)));
END $$;

CREATE OR REPLACE FUNCTION cow._eq2(lcols text[], l text, rcols text[], r text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    res text;
BEGIN
    FOR i IN coalesce(array_lower(lcols, 1), 1) .. coalesce(array_upper(lcols, 1), 0) LOOP
        res := concat_ws(' AND ', res, format('%s.%I = %s.%I', l, lcols[i], r, rcols[i]));
    END LOOP;
    RETURN res;
END $$;

-- "SELECT r.a AS a, r.b AS b": a row source naming a record's fields as columns, for generated-column and CHECK
-- expressions (which name columns bare).
CREATE OR REPLACE FUNCTION cow._rowsrc(cols text[], r text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'SELECT ' || string_agg(format('%s.%I AS %I', r, c, c), ', ' ORDER BY i)
    FROM unnest(cols) WITH ORDINALITY AS t(c, i)
$$;

-- The HINT of the layer's 40001 for a row that another transaction of the session changed after the statement
-- read it (a write's, cow.lock_rows'). In READ COMMITTED the plain table would have run the statement on the
-- row's new version (EvalPlanQual), which an INSTEAD OF trigger cannot; a statement alone in its implicit
-- transaction left nothing when it failed, so the proxy runs it again when the HINT is exactly the READ
-- COMMITTED one (proxy/retry.py, RERUN_HINT). In REPEATABLE READ and SERIALIZABLE the plain table fails too,
-- so that HINT is another: such a 40001 is never run again.
CREATE OR REPLACE FUNCTION cow._row_changed_hint() RETURNS text LANGUAGE sql STABLE
RETURN CASE WHEN pg_catalog.current_setting('transaction_isolation') = 'read committed'
            THEN 'Retry the transaction: in READ COMMITTED it runs on the row''s new version.'
            ELSE 'Retry the transaction: it reads the new version.' END;

CREATE OR REPLACE FUNCTION cow._raise(errcode text, message text, detail text, p_schema text, p_table text,
                                      p_constraint text DEFAULT NULL, p_column text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN format('RAISE EXCEPTION USING ERRCODE = %L, MESSAGE = %L%s, SCHEMA = %L, TABLE = %L%s%s;',
                  errcode, message, CASE WHEN detail IS NULL THEN '' ELSE ', DETAIL = ' || detail END,
                  p_schema, p_table,
                  CASE WHEN p_constraint IS NULL THEN '' ELSE format(', CONSTRAINT = %L', p_constraint) END,
                  CASE WHEN p_column IS NULL THEN '' ELSE format(', COLUMN = %L', p_column) END);
END $$;
