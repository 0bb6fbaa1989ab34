-- cowproxy copy-on-write layer: enabling schemas and tables, keeping them in step with app DDL, and teardown.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

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
    note text;
BEGIN
    SELECT n.nspname, c.relname INTO sch, tab FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = p_rel;
    PERFORM cow._add_guard(p_rel);
    -- (A registered table whose kind changed, cow._kl_recheck, is dropped from the registry and enabled anew.)
    IF EXISTS (SELECT 1 FROM cow.registry WHERE relid = p_rel) AND NOT cow._kl_recheck(p_rel) THEN
        RETURN NULL;
    END IF;
    -- A table without a key (cow._key_index: a primary key, or a NOT NULL unique index that stands in for it)
    -- is enabled as a keyless table (35_keyless.sql) when its rows can be compared.
    IF cow._pk_columns(p_rel) IS NULL THEN
        note := cow._kl_refusal(p_rel);
        IF note IS NOT NULL THEN
            RETURN format('table %I.%I %s: not enabled (it stays plain; writes to it in a session are refused)',
                          sch, tab, note);
        END IF;
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

-- The tables a FOREIGN KEY links table p_rel to (either side; itself left out).
-- (plpgsql: a SQL function planned its query at each call, ~1 ms.)
CREATE OR REPLACE FUNCTION cow._neighbours(p_rel oid) RETURNS oid[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(DISTINCT q.n ORDER BY q.n), '{}')
            FROM (SELECT k.confrelid AS n FROM pg_catalog.pg_constraint k WHERE k.conrelid = p_rel AND k.contype = 'f'
                  UNION
                  SELECT k.conrelid FROM pg_catalog.pg_constraint k
                  WHERE k.oid IN (SELECT f.oid FROM cow._fks_to(p_rel) AS f(oid))) q
            WHERE q.n <> p_rel);
END $$;

-- The INSTEAD OF, statement and constraint triggers of registry entry p_id (keyed or keyless), and the
-- neighbours they were made with (registry.neighbours, for cow._build_linked_triggers).
CREATE OR REPLACE FUNCTION cow._build_table_triggers(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    PERFORM cow._build_triggers(p_id);
    UPDATE cow.registry g SET neighbours = cow._neighbours(g.relid) WHERE g.id = p_id;
END $gen$;

-- The triggers of registry entries p_built (whose views were just built) and of their FOREIGN KEY neighbours
-- whose own signature (cow._signature) changed. A neighbour's triggers read of the table only what its
-- signature covers: the table's name and overlay view (cow._session_rel: registered or not) and the
-- constraints between the two with their columns. So an `ADD COLUMN` leaves the neighbours alone (their
-- triggers were regenerated at every app DDL statement: ~300 ms each under load), while registering the
-- table, renaming it or a referenced column, or adding or dropping a FOREIGN KEY regenerates them. The
-- neighbours: those linked now and those linked at the table's last build (registry.neighbours), which a
-- dropped FOREIGN KEY leaves with cascade code to remove. Returns the neighbours' ids that were rebuilt.
CREATE OR REPLACE FUNCTION cow._build_linked_triggers(p_built int[]) RETURNS int[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
    done int[] := '{}';
BEGIN
    FOR x IN SELECT g.id, g.relid, g.signature, g.id = ANY (p_built) AS own FROM cow.registry g
             WHERE g.id = ANY (p_built)
                OR g.relid IN (SELECT unnest(cow._neighbours(b.relid) || coalesce(b.neighbours, '{}'))
                               FROM cow.registry b WHERE b.id = ANY (p_built))
             ORDER BY g.id LOOP
        IF x.own OR x.signature IS DISTINCT FROM cow._signature(x.relid) THEN
            PERFORM cow._build_table_triggers(x.id);
            IF NOT x.own THEN
                done := done || x.id;
            END IF;
        END IF;
    END LOOP;
    RETURN done;
END $gen$;

-- Bring every enabled schema in step: new tables enabled, dropped tables' overlays removed, changed tables
-- regenerated, guards present, view twins rebuilt. Returns notes (skipped tables, unsupported objects).
-- The layer's own DDL runs with client_min_messages = warning: its "already exists, skipping" and "drop
-- cascades to" notices reached the application's migration tool at every DDL statement it ran.
-- cow.refresh is the entry point of a user (refused on a bound connection); the DDL event trigger calls
-- cow._refresh, also for DDL a bound connection runs (when the proxy lets it).
CREATE OR REPLACE FUNCTION cow.refresh(p_force boolean DEFAULT false) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cow._refuse_bound('refresh');
    RETURN QUERY SELECT * FROM cow._refresh(p_force);
END $$;

-- The generated functions are created with check_function_bodies off: the validator compiled each one again
-- (~8 ms for a table's UPDATE trigger function, a quarter of install's time per table); the generated code
-- is compiled and run by the tests (tests/layer/test_generated_sql.py and the behaviour tests), and a
-- function is compiled at its first call anyway.
CREATE OR REPLACE FUNCTION cow._refresh(p_force boolean DEFAULT false) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning
SET check_function_bodies = off AS $gen$
DECLARE
    x record;
    note text;
    rebuilt boolean := p_force;
    built int[] := '{}';
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    -- Tables that are gone, or moved out of the enabled schemas.
    FOR x IN SELECT g.id FROM cow.registry g
             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                               JOIN cow.schemas s ON s.schema_name = n.nspname
                               WHERE c.oid = g.relid AND NOT c.relname = ANY (s.excluded)) LOOP
        PERFORM cow._unregister(x.id);
        rebuilt := true;
    END LOOP;
    -- Functions of changes tables that are gone (a table's drop left its constraint-trigger functions behind
    -- before cow._unregister dropped them by prefix).
    FOR x IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'cow_changes'
               AND substring(p.proname FROM '^(t[0-9]+)_') NOT IN (SELECT g.changes_table FROM cow.registry g) LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s', x.f);
    END LOOP;
    -- Keyed tables whose key (cow._key_index) now has other columns (a primary key added on other columns, the
    -- key index dropped or a key column made nullable while another unique index qualifies, REPLICA
    -- IDENTITY): dropped from the registry, and enabled anew with the new key below (_register). Refused
    -- (cow._kl_unregister: 0A000) while a session holds changes to the table: its versions are keyed by the
    -- old columns (<t>_cur, each version's origin), so commit would turn an update into a delete and an insert
    -- (ON DELETE actions firing on the base) and two versions may share the new key. A table left without a
    -- key changes kind: cow._kl_recheck, in _register. (By attribute number: renaming a key column is no change.)
    FOR x IN SELECT g.*, cow._pk_columns(g.relid) AS key FROM cow.registry g
             WHERE g.pk_columns <> '{}' AND cow._key_index(g.relid) IS NOT NULL
               AND (SELECT (i.indkey::int2[])[0:i.indnkeyatts - 1]::int[] FROM pg_index i
                    WHERE i.indexrelid = cow._key_index(g.relid))
                   IS DISTINCT FROM ARRAY(SELECT g.col_attnums[array_position(g.col_names, k.c)]
                                          FROM unnest(g.pk_columns) WITH ORDINALITY AS k(c, o) ORDER BY k.o) LOOP
        PERFORM cow._kl_unregister(x.id, format('would change its row key from (%s) to (%s)',
                                                array_to_string(x.pk_columns, ', '), array_to_string(x.key, ', ')));
        rebuilt := true;
    END LOOP;
    PERFORM cow._overlay_schemas();
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
            IF cow._pk_columns(x.relid) IS NULL THEN
                PERFORM cow._kl_build_view(x.id);
            ELSE
                PERFORM cow._build_view(x.id);
            END IF;
            built := built || x.id;
        END IF;
    END LOOP;
    -- The triggers of the tables whose view was built and of their foreign-key neighbours (whose triggers read
    -- their keys and actions); of every table after a drop, a change of key or with p_force. Rebuilding every
    -- table's triggers for each app DDL statement cost ~40 ms per enabled table.
    IF rebuilt THEN
        FOR x IN SELECT g.id FROM cow.registry g ORDER BY g.id LOOP
            PERFORM cow._build_table_triggers(x.id);
        END LOOP;
    ELSIF built <> '{}' THEN
        PERFORM cow._build_linked_triggers(built);
    ELSE
        -- The mirrors of base indexes (cow._build_lookup_indexes) after CREATE or DROP INDEX of a non-unique
        -- index, which leaves the signature alone: it is Django's index of every foreign key, and a new
        -- signature would rebuild every table's triggers (~40 ms per table) for each such index.
        PERFORM cow._sync_lookup_indexes(NULL);
    END IF;
    PERFORM cow._rls_sync();  -- tables with row-level security (38_rls.sql)
    PERFORM cow._fire_always();
    FOR note IN SELECT * FROM cow._build_twins() LOOP
        RETURN NEXT note;
    END LOOP;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

-- Validate and record an enabled schema (install then enables its tables in batches: cow._refresh_tables).
CREATE OR REPLACE FUNCTION cow._add_schema(p_schema text, p_exclude text[] DEFAULT '{}') RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    t text;
BEGIN
    PERFORM cow._refuse_bound('enable_schema');
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
END $gen$;

CREATE OR REPLACE FUNCTION cow.enable_schema(p_schema text, p_exclude text[] DEFAULT '{}') RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    PERFORM cow._add_schema(p_schema, p_exclude);
    RETURN QUERY SELECT * FROM cow.refresh();
END $gen$;

-- The tables of enabled schemas that cow._refresh_tables would change: not registered yet, without their guard
-- (partitions), or whose overlay view is stale or missing (all registered ones with p_force). In name order.
CREATE OR REPLACE FUNCTION cow._pending_tables(p_force boolean DEFAULT false) RETURNS SETOF oid
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN cow.schemas s ON s.schema_name = n.nspname
    LEFT JOIN cow.registry g ON g.relid = c.oid
    WHERE c.relkind IN ('r', 'p') AND NOT c.relname = ANY (s.excluded)
      AND CASE WHEN c.relispartition
               THEN NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'cow_guard')
               ELSE g.id IS NULL OR p_force OR g.signature IS DISTINCT FROM cow._signature(c.oid)
                    OR to_regclass(format('%I.%I', g.overlay_schema, c.relname)) IS NULL END
    ORDER BY n.nspname, c.relname
$$;

-- The tables of enabled schemas without their guard (install guards every table before enabling any, so that a
-- session started while an install is under way is refused writes to the tables not enabled yet).
CREATE OR REPLACE FUNCTION cow._unguarded_tables() RETURNS SETOF oid
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN cow.schemas s ON s.schema_name = n.nspname
    WHERE c.relkind IN ('r', 'p') AND NOT c.relname = ANY (s.excluded)
      AND NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND cow._guard_current(t))
    ORDER BY n.nspname, c.relname
$$;

CREATE OR REPLACE FUNCTION cow._guard_tables(p_rels oid[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $$
DECLARE
    r oid;
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    FOREACH r IN ARRAY p_rels LOOP
        PERFORM cow._add_guard(r);
    END LOOP;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $$;

-- The overlay schemas of the enabled schemas, made and opened to PUBLIC when they are not yet. Only then: a
-- GRANT rewrites the schema's catalog row even when the privilege is there, and two of install's batches
-- running at once failed on that row ("tuple concurrently updated").
CREATE OR REPLACE FUNCTION cow._overlay_schemas() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $gen$
DECLARE
    x record;
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    FOR x IN SELECT s.overlay_schema FROM cow.schemas s
             WHERE NOT EXISTS (SELECT 1 FROM pg_namespace n, aclexplode(n.nspacl) a
                               WHERE n.nspname = s.overlay_schema AND a.grantee = 0 AND a.privilege_type = 'USAGE') LOOP
        EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', x.overlay_schema);
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO PUBLIC', x.overlay_schema);
    END LOOP;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

-- cow.refresh for some tables only (install's batches, app DDL on one table): registers and guards them, builds
-- the overlay views that are stale or missing (all with p_force), and the triggers of these tables and of the
-- enabled tables a foreign key links them to (the generated triggers read their neighbours' keys and
-- actions). Each table is enabled whole within the caller's transaction. Returns notes.
CREATE OR REPLACE FUNCTION cow._refresh_tables(p_rels oid[], p_force boolean DEFAULT false) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    RETURN QUERY SELECT * FROM cow._refresh_batch(p_rels, p_force, true);
END $gen$;

-- cow._refresh_tables, with p_linked false for install's batches that run at once on several connections:
-- only these tables' objects are made, never a neighbour's triggers, which another batch may be writing (two
-- transactions replacing one function: "tuple concurrently updated"). Such a batch runs in REPEATABLE READ,
-- so that each table's triggers and the signature recorded with them read the registry as of one snapshot:
-- a neighbour that another batch registers meanwhile leaves both tables' signatures stale, and install
-- brings them in step afterwards, one batch at a time and with their neighbours (migrations/layer.py).
CREATE OR REPLACE FUNCTION cow._refresh_batch(p_rels oid[], p_force boolean, p_linked boolean) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning
SET check_function_bodies = off AS $gen$
DECLARE
    x record;
    note text;
    built int[] := '{}';
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    PERFORM cow._overlay_schemas();
    FOR x IN SELECT c.oid, c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN cow.schemas s ON s.schema_name = n.nspname
             WHERE c.oid = ANY (p_rels) AND c.relkind IN ('r', 'p') AND NOT c.relname = ANY (s.excluded)
             ORDER BY n.nspname, c.relname LOOP
        IF x.relispartition THEN
            PERFORM cow._add_guard(x.oid);
        ELSE
            note := cow._register(x.oid);
            IF note IS NOT NULL THEN
                RETURN NEXT note;
            END IF;
        END IF;
    END LOOP;
    FOR x IN SELECT g.id, g.relid, g.signature, g.overlay_schema, g.table_name FROM cow.registry g
             WHERE g.relid = ANY (p_rels) ORDER BY g.id LOOP
        IF p_force OR x.signature IS NULL OR x.signature IS DISTINCT FROM cow._signature(x.relid)
           OR to_regclass(format('%I.%I', x.overlay_schema, (SELECT relname FROM pg_class WHERE oid = x.relid))) IS NULL THEN
            IF cow._pk_columns(x.relid) IS NULL THEN
                PERFORM cow._kl_build_view(x.id);
            ELSE
                PERFORM cow._build_view(x.id);
            END IF;
            built := built || x.id;
        END IF;
    END LOOP;
    IF built <> '{}' AND p_linked THEN
        built := built || cow._build_linked_triggers(built);
    ELSE
        FOR x IN SELECT unnest(built) AS id ORDER BY 1 LOOP
            PERFORM cow._build_table_triggers(x.id);
        END LOOP;
    END IF;
    -- (Only the tables whose objects were made here: a pass over the whole registry in each of install's
    -- batches made install quadratic in the number of tables.)
    PERFORM cow._rls_sync(built || ARRAY(SELECT g.id FROM cow.registry g WHERE g.relid = ANY (p_rels)));  -- 38_rls.sql
    PERFORM cow._fire_always(built);
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

-- Install's step after batches that ran at once (cow._refresh_batch with p_linked false): of the tables p_rels
-- (those a foreign key links to a table of another batch), those whose signature is stale get their triggers
-- again. A table's view is current then, as its batch made it moments ago (app DDL since then rebuilt it
-- through the event trigger); what went stale is what its triggers read of a neighbour that a concurrent
-- batch registered. So the triggers only, ~half a table's work: the view, changes table and indexes stay. A
-- table not registered, or whose view is missing or whose columns or key differ from those the registry
-- recorded, gets everything (cow._refresh_tables). Returns notes.
CREATE OR REPLACE FUNCTION cow._relink_tables(p_rels oid[]) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning
SET check_function_bodies = off AS $gen$
DECLARE
    x record;
    relinked int[] := '{}';
    whole oid[];
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    whole := ARRAY(SELECT r FROM unnest(p_rels) AS r WHERE NOT EXISTS (SELECT 1 FROM cow.registry g WHERE g.relid = r));
    FOR x IN SELECT g.id, g.relid,
                    to_regclass(format('%I.%I', g.overlay_schema, g.table_name)) IS NOT NULL
                    AND (g.col_names, g.col_types, g.col_attnums) = (b.names, b.types, b.nums)
                    AND g.pk_columns IS NOT DISTINCT FROM coalesce(cow._pk_columns(g.relid), '{}') AS current
             FROM cow.registry g, cow._base_columns(g.relid) AS b
             WHERE g.relid = ANY (p_rels) AND g.signature IS DISTINCT FROM cow._signature(g.relid)
             ORDER BY g.id LOOP
        IF x.current THEN
            PERFORM cow._build_table_triggers(x.id);
            relinked := relinked || x.id;
        ELSE
            whole := whole || x.relid;
        END IF;
    END LOOP;
    PERFORM cow._rls_sync(relinked);
    PERFORM cow._fire_always(relinked);
    IF whole <> '{}' THEN
        RETURN QUERY SELECT * FROM cow._refresh_tables(whole);
    END IF;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

-- The triggers of the overlay views and the changes tables fire whatever session_replication_role says
-- (tgenabled 'A'), so that `SET session_replication_role = replica` cannot make a session's write report
-- success and vanish (an INSTEAD OF trigger that does not fire leaves "INSERT 0 1" and nothing written).
-- PostgreSQL's ALTER TABLE ... ENABLE ALWAYS TRIGGER refuses views, so pg_trigger is updated directly: the
-- CREATE TRIGGER of the same transaction makes every backend reload the relation's triggers. Only a
-- superuser may: after a non-superuser's DDL the rebuilt triggers fire on origin only until the next
-- `cowproxy install` (a non-superuser cannot set session_replication_role, unless granted SET on it).
-- A pg_dump of the whole database then holds ALTER TABLE ... ENABLE ALWAYS TRIGGER lines for views, which a
-- restore reports as errors (the triggers are restored, firing on origin only; install marks them again).
-- p_ids: the registry entries to mark (NULL: all).
CREATE OR REPLACE FUNCTION cow._fire_always(p_ids int[] DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user), false) THEN
        RETURN;
    END IF;
    UPDATE pg_trigger t SET tgenabled = 'A'
    FROM cow.registry g
    WHERE (p_ids IS NULL OR g.id = ANY (p_ids))
      AND t.tgrelid IN (to_regclass(format('%I.%I', g.overlay_schema, g.table_name)),
                        to_regclass(format('cow_changes.%I', g.changes_table)))
      AND NOT t.tgisinternal AND t.tgenabled <> 'A';
END $$;

-- Enable one table (its schema becomes enabled; the schema's other tables are enabled too).
CREATE OR REPLACE FUNCTION cow.enable_table(p_rel regclass) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    RETURN QUERY SELECT * FROM cow.enable_schema(
        (SELECT n.nspname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = p_rel));
END $gen$;

-- Remove every layer object except schema cow itself (the caller drops it): guards, overlays, changes, event
-- triggers. Refuses while sessions hold changes, unless p_discard.
CREATE OR REPLACE FUNCTION cow._teardown(p_discard boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    x record;
    n bigint;
    holders text[] := '{}';
BEGIN
    PERFORM cow._refuse_bound('uninstall');
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
    DROP EVENT TRIGGER IF EXISTS cow_ddl_drop;
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

-- The mirrors of base indexes (cow._build_lookup_indexes) of the registry rows p_ids (all when NULL) whose
-- count differs from the base table's mirrored indexes. Each count is an index lookup of pg_index (scanning
-- pg_class by name for every table made install and app DDL quadratic in the number of tables).
CREATE OR REPLACE FUNCTION cow._sync_lookup_indexes(p_ids int[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
BEGIN
    FOR x IN SELECT g.id FROM cow.registry g
             WHERE (p_ids IS NULL OR g.id = ANY (p_ids))
               AND (SELECT count(*) FROM pg_index i WHERE i.indrelid = g.relid AND cow._mirrored(i))
                   <> (SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                       WHERE i.indrelid = to_regclass(format('cow_changes.%I', g.changes_table))
                         AND c.relname LIKE g.changes_table || '\_xq%') LOOP
        PERFORM cow._build_lookup_indexes(x.id);
        -- A new row version changes the catalog version: proxies re-read the indexes they plan with.
        UPDATE cow.registry SET signature = signature WHERE id = x.id;
    END LOOP;
END $gen$;

-- What the layer made for registry entry p_id (its overlay view, its changes table and every function generated
-- for it, cow_changes.<changes table>_*), and the entry. The caller decides whether sessions' changes to the
-- table may go (a dropped table's go with it).
CREATE OR REPLACE FUNCTION cow._unregister(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r cow.registry%ROWTYPE;
    f regprocedure;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', r.overlay_schema, r.table_name);
    EXECUTE format('DROP TABLE IF EXISTS cow_changes.%I CASCADE', r.changes_table);
    -- By prefix: which trigger functions a table has depends on its constraints (_fkcheck, _mark, _dfr), and
    -- the table's drop leaves them (changes tables are named t<id>, so the prefix is the table's alone).
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'cow_changes' AND starts_with(p.proname, r.changes_table || '_') LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS %s', f);
    END LOOP;
    DELETE FROM cow.registry WHERE id = p_id;
END $$;

-- The tables of p_rels that no longer exist (DROP TABLE) leave the registry (cow._unregister); returns p_rels
-- with their FOREIGN KEY neighbours as of their last build (registry.neighbours, either side), whose triggers
-- and signatures the drop changed (a CASCADE drops the constraints that referenced them).
CREATE OR REPLACE FUNCTION cow._unregister_dropped(p_rels oid[]) RETURNS oid[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    gone int[];
    gone_rels oid[];
    x int;
BEGIN
    SELECT array_agg(g.id), array_agg(g.relid) INTO gone, gone_rels FROM cow.registry g
    WHERE g.relid = ANY (p_rels) AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = g.relid);
    IF gone IS NULL THEN
        RETURN p_rels;
    END IF;
    p_rels := p_rels || ARRAY(SELECT n FROM cow.registry g, unnest(g.neighbours) AS n WHERE g.id = ANY (gone))
                     || ARRAY(SELECT g.relid FROM cow.registry g WHERE g.neighbours && gone_rels);
    FOREACH x IN ARRAY gone LOOP
        PERFORM cow._unregister(x);
    END LOOP;
    RETURN ARRAY(SELECT DISTINCT r FROM unnest(p_rels) AS r WHERE NOT r = ANY (gone_rels));
END $$;

-- App DDL on some tables only (ALTER TABLE, CREATE INDEX, CREATE TABLE, DROP TABLE: the event trigger passes
-- the tables its commands name): what cow.refresh does for them, or a full cow.refresh when one of them left
-- the enabled schemas, changed its key or is not a plain table. Layer work independent of the number of
-- enabled tables.
CREATE OR REPLACE FUNCTION cow._refresh_for_ddl(p_rels oid[]) RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $gen$
DECLARE
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    p_rels := cow._unregister_dropped(p_rels);
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
    IF EXISTS (SELECT 1 FROM cow.registry g WHERE g.relid = ANY (p_rels)
               AND (NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                JOIN cow.schemas s ON s.schema_name = n.nspname
                                WHERE c.oid = g.relid AND NOT c.relname = ANY (s.excluded))
                    OR (g.pk_columns <> '{}') IS DISTINCT FROM (cow._key_index(g.relid) IS NOT NULL)
                    OR (g.pk_columns <> '{}' AND g.pk_columns IS DISTINCT FROM cow._pk_columns(g.relid)))) THEN
        RETURN QUERY SELECT * FROM cow._refresh();
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM cow._refresh_tables(p_rels);
    PERFORM set_config('cow.in_layer', 'on', true);
    PERFORM cow._sync_lookup_indexes(ARRAY(SELECT g.id FROM cow.registry g WHERE g.relid = ANY (p_rels)));
    -- The twins only when a view of an enabled schema reads one of these tables (pg_depend's index): a twin
    -- reads the overlay views of the tables its app view reads, so no other twin went with the views that
    -- cow._ddl_start dropped, and DDL of tables cannot make another app view need one. cow._build_twins
    -- scans pg_class twice (~20 ms with 2,000 tables).
    IF EXISTS (SELECT 1 FROM pg_depend d JOIN pg_rewrite rw ON rw.oid = d.objid
               JOIN pg_class v ON v.oid = rw.ev_class JOIN pg_namespace n ON n.oid = v.relnamespace
               WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
                 AND d.refobjid = ANY (p_rels) AND rw.ev_class <> d.refobjid
                 AND n.nspname IN (SELECT schema_name FROM cow.schemas)) THEN
        RETURN QUERY SELECT * FROM cow._build_twins();
    END IF;
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;
