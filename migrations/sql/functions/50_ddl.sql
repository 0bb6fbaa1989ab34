-- cowproxy copy-on-write layer: the event triggers that keep the overlay in step with app DDL.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- Event triggers: app DDL goes through; the overlay follows.
-- Whether SQL text p_sql names relation p_name as a word (unquoted in any case, or quoted): a cheap test that
-- may say yes for a name in a string or comment (then a view is dropped and rebuilt for nothing).
CREATE OR REPLACE FUNCTION cow._named_in(p_sql text, p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT strpos(lower(p_sql), lower(p_name)) > 0
       AND p_sql ~* ('(^|[^[:alnum:]_$])' || regexp_replace(p_name, '([^[:alnum:]_])', '\\\1', 'g')
                     || '($|[^[:alnum:]_$])')
$$;

-- The relation names SQL text p_sql can name without double quotes: its words as written, lowercased, and
-- with ASCII letters lowercased (PostgreSQL's folding of an unquoted identifier); NULL when the text has a
-- double quote (then any name may be in it). cow._ddl_start looks its candidates up by name (an index scan
-- of pg_class) instead of testing every overlay view's name against the text (~15 ms with 2,000 tables).
CREATE OR REPLACE FUNCTION cow._name_candidates(p_sql text) RETURNS name[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN strpos(p_sql, '"') > 0 THEN NULL
                ELSE ARRAY(SELECT DISTINCT v::name
                           FROM regexp_matches(p_sql, '[[:alpha:]_][[:alnum:]_$]*', 'g') AS m(w),
                                LATERAL (VALUES (m.w[1]), (lower(m.w[1])),
                                                (translate(m.w[1], 'ABCDEFGHIJKLMNOPQRSTUVWXYZ',
                                                           'abcdefghijklmnopqrstuvwxyz'))) AS t(v)) END
$$;

-- Whether SQL text p_sql is one ALTER TABLE or DROP TABLE of relations that can only be the backend's
-- temporary ones: every name it gives (unquoted, bare or pg_temp-qualified) is a relation in no schema but
-- a temporary one (or in none: DROP TABLE IF EXISTS of a table not made yet). Such a statement changes
-- nothing of the layer's (no permanent object depends on a temporary table), so the event triggers leave
-- the overlay alone; otherwise cow._ddl_start, finding no overlay view named in the text, would drop and
-- rebuild them all. Any other text (a comment first, quotes, several statements, DDL run by a function):
-- false, the general path.
CREATE OR REPLACE FUNCTION cow._temp_only_ddl(p_sql text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH m AS (
        SELECT regexp_match(p_sql,
            '^\s*(?:DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?((?:pg_temp\s*\.\s*)?[a-z_][a-z0-9_$]*'
            '(?:\s*,\s*(?:pg_temp\s*\.\s*)?[a-z_][a-z0-9_$]*)*)\s*(?:CASCADE|RESTRICT)?'
            '|ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?((?:pg_temp\s*\.\s*)?[a-z_][a-z0-9_$]*)\s[^;]*)'
            '\s*;?\s*$', 'i') AS g
    ), names AS (
        SELECT lower(regexp_replace(btrim(n), '^pg_temp\s*\.\s*', '', 'i'))::name AS relname
        FROM m, unnest(string_to_array(coalesce(m.g[1], m.g[2]), ',')) AS n
    )
    SELECT count(*) > 0 AND bool_and(NOT EXISTS (
        SELECT 1 FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
        WHERE c.relname = names.relname AND s.nspname !~ '^pg_(toast_)?temp_'))
    FROM names
$$;

-- Whether ALTER TABLE / DROP TABLE text p_sql (which names no overlay view) is about relations outside the
-- layer: a candidate name of it (cow._name_candidates) is a relation of a schema the layer does not enable, and
-- none is an enabled table's. Then the layer has nothing to drop or rebuild (it dropped every overlay view and
-- rebuilt every table: at about 600 tables PostgreSQL's lock table ran out and the app's DDL failed). Without
-- such a name (DDL run inside a function, a quoted name) the caller takes the general path.
CREATE OR REPLACE FUNCTION cow._names_other_relation(p_sql text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH c AS (SELECT unnest(cow._name_candidates(p_sql)) AS relname)
    SELECT EXISTS (SELECT 1 FROM pg_class r JOIN c ON r.relname = c.relname
                   JOIN pg_namespace n ON n.oid = r.relnamespace
                   WHERE r.relkind IN ('r', 'p', 'v', 'm', 'f')
                     AND n.nspname NOT IN (SELECT schema_name FROM cow.schemas)
                     AND n.nspname NOT IN (SELECT overlay_schema FROM cow.schemas)
                     AND n.nspname NOT IN ('cow', 'cow_changes', 'pg_catalog', 'information_schema'))
       AND NOT EXISTS (SELECT 1 FROM cow.registry g JOIN c ON g.table_name = c.relname::text)
$$;

-- Whether GRANT/REVOKE text p_sql is about tables it names: ON [TABLE] names, not ALL TABLES IN SCHEMA, and
-- at least one name is a relation (else it ran inside a function: the caller takes the general path).
CREATE OR REPLACE FUNCTION cow._names_tables_only(p_sql text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT (SELECT bool_and(d.object_type = 'TABLE') FROM pg_event_trigger_ddl_commands() d)
       AND p_sql !~* '\mALL\s+TABLES\M'
       AND (EXISTS (SELECT 1 FROM cow.registry g WHERE g.table_name = ANY (cow._name_candidates(p_sql)::text[]))
            OR cow._names_other_relation(p_sql))
$$;

-- The enabled tables of the indexes DROP INDEX text p_sql names (NULL when it has a quoted name).
CREATE OR REPLACE FUNCTION cow._indexed_tables(p_sql text) RETURNS oid[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN cow._name_candidates(p_sql) IS NOT NULL THEN
        ARRAY(SELECT DISTINCT i.indrelid FROM pg_class r JOIN pg_index i ON i.indexrelid = r.oid
              JOIN cow.registry g ON g.relid = i.indrelid
              WHERE r.relname = ANY (cow._name_candidates(p_sql)) AND r.relkind = 'i') END
$$;

-- The enabled tables a DROP changed (sql_drop): a dropped column, default, constraint, index, trigger, policy
-- or rule of a base table, as the names of pg_event_trigger_dropped_objects() give them, collected for
-- cow._ddl_end in the transaction-local GUC cow._ddl_touched (DROP TYPE … CASCADE drops a column, DROP
-- FUNCTION … CASCADE a default: those tables are regenerated, no other).
CREATE OR REPLACE FUNCTION cow._ddl_drop() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    touched text;
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    SELECT string_agg(DISTINCT g.relid::text, ',') INTO touched
    FROM pg_event_trigger_dropped_objects() d
    JOIN cow.registry g ON g.table_schema = d.address_names[1] AND g.table_name = d.address_names[2]
    WHERE d.object_type IN ('table column', 'default value', 'table constraint', 'trigger', 'policy', 'rule')
      AND cardinality(d.address_names) >= 3;
    IF touched IS NOT NULL THEN
        PERFORM set_config('cow._ddl_touched',
                           concat_ws(',', nullif(current_setting('cow._ddl_touched', true), ''), touched), true);
    END IF;
END $gen$;

CREATE OR REPLACE FUNCTION cow._ddl_start() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $gen$
DECLARE
    x record;
    named boolean := false;
    dropped oid[] := '{}';
    cands name[];
BEGIN
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    -- The overlay views depend on the base columns: drop them so that DROP COLUMN, ALTER COLUMN TYPE and
    -- DROP TABLE of the app are not blocked; ddl_command_end recreates them (the changes tables stay).
    IF tg_tag IN ('ALTER TABLE', 'DROP TABLE') AND cow._temp_only_ddl(current_query()) THEN
        PERFORM set_config('cow._ddl_dropped', 'temp', true);  -- (for cow._ddl_end: nothing to rebuild)
        RETURN;
    END IF;
    IF tg_tag = 'DROP INDEX' THEN
        -- (Its tables' index mirrors follow at ddl_command_end; the views do not depend on indexes.)
        PERFORM set_config('cow._ddl_dropped',
                           coalesce(array_to_string(cow._indexed_tables(current_query()), ','), 'all'), true);
        RETURN;
    END IF;
    -- The other drops (types, domains, sequences, functions, collations, views) and ALTER TYPE/DOMAIN/VIEW need
    -- no view dropped first: an overlay view depends on such an object only where its base table does, so a
    -- RESTRICT fails as on the plain table and a CASCADE takes the overlay view (or its default) along;
    -- cow._ddl_end rebuilds what went (cow._ddl_drop names the tables).
    IF tg_tag IN ('ALTER TABLE', 'DROP TABLE', 'DROP SCHEMA', 'ALTER SCHEMA', 'DROP OWNED') THEN
        PERFORM set_config('cow.in_layer', 'on', true);
        -- ALTER TABLE and DROP TABLE change only tables their text names: drop only the views of those (each
        -- app DDL statement rebuilt every enabled table's view). A statement that names none (DDL run by a
        -- function) drops them all, as every other tag does.
        -- (The names the text can hold are looked up by name; every overlay view's name is tested only when
        -- the text has a quoted identifier.)
        cands := CASE WHEN tg_tag IN ('ALTER TABLE', 'DROP TABLE') THEN cow._name_candidates(current_query()) END;
        -- (The registry by (table_schema, table_name), its unique index: by overlay_schema it was a scan.)
        FOR x IN SELECT n.nspname, c.relname, g.relid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN cow.schemas s ON s.overlay_schema = n.nspname
                 LEFT JOIN cow.registry g ON g.table_schema = s.schema_name AND g.table_name = c.relname::text
                 WHERE c.relname = ANY (cands) AND c.relkind = 'v' AND cow._named_in(current_query(), c.relname)
                 UNION ALL
                 SELECT n.nspname, c.relname, g.relid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 LEFT JOIN cow.registry g ON g.overlay_schema = n.nspname AND g.table_name = c.relname
                 WHERE cands IS NULL AND tg_tag IN ('ALTER TABLE', 'DROP TABLE')
                   AND n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND c.relkind = 'v'
                   AND cow._named_in(current_query(), c.relname) LOOP
            EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.nspname, x.relname);
            named := true;
            dropped := dropped || x.relid;
        END LOOP;
        -- (Asked only when no overlay view is named: it costs the common case nothing.)
        IF NOT named AND tg_tag IN ('ALTER TABLE', 'DROP TABLE') AND cow._names_other_relation(current_query()) THEN
            PERFORM set_config('cow._ddl_dropped', '', true);
            PERFORM set_config('cow.in_layer', '', true);
            RETURN;
        END IF;
        FOR x IN SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname IN (SELECT overlay_schema FROM cow.schemas) AND c.relkind = 'v' AND NOT named LOOP
            EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', x.nspname, x.relname);
        END LOOP;
        -- For ddl_command_end: the tables whose views are gone (NULL: all of them).
        PERFORM set_config('cow._ddl_dropped', CASE WHEN named THEN array_to_string(dropped, ',') ELSE 'all' END,
                           true);
        PERFORM set_config('cow.in_layer', '', true);
    END IF;
END $gen$;

CREATE OR REPLACE FUNCTION cow._ddl_end() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    note text;
    rels oid[];
    targeted boolean;
    dropped text;
    unguarded text;
BEGIN
    -- A bound connection (an agent's, docs/threat-model.md) may not switch a guard off, whatever
    -- cow.in_layer says (a GUC it can set): the base table would take its writes.
    IF tg_tag IN ('ALTER TABLE', 'DROP TRIGGER') AND cow._bound() IS NOT NULL THEN
        SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ') INTO unguarded
        FROM cow.schemas s JOIN pg_namespace n ON n.nspname = s.schema_name
        JOIN pg_class c ON c.relnamespace = n.oid AND c.relkind IN ('r', 'p') AND NOT c.relname = ANY (s.excluded)
        WHERE NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'cow_guard'
                          AND t.tgenabled IN ('O', 'A'));
        IF unguarded IS NOT NULL THEN
            RAISE EXCEPTION 'cowproxy: % refused: it would leave % without the layer''s guard (this connection is bound to session %)',
                tg_tag, unguarded, cow._bound() USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    IF current_setting('cow.in_layer', true) = 'on' THEN
        RETURN;
    END IF;
    -- An application's temporary tables (and their indexes, sequences, views) are none of the layer's: a
    -- CREATE TEMP TABLE ran a refresh, whose GRANTs on the overlay schemas made concurrent ones fail
    -- ('tuple concurrently updated'). (bool_and of no command, a DROP's: NULL.)
    IF current_setting('cow._ddl_dropped', true) = 'temp' THEN
        PERFORM set_config('cow._ddl_dropped', '', true);
        RETURN;
    END IF;
    IF (SELECT bool_and(d.schema_name = 'pg_temp') FROM pg_event_trigger_ddl_commands() d) THEN
        RETURN;
    END IF;
    IF tg_tag IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE', 'DROP TABLE', 'CREATE INDEX',
                  'DROP INDEX', 'ALTER INDEX', 'CREATE SCHEMA', 'DROP SCHEMA', 'ALTER SCHEMA', 'ALTER TYPE',
                  'DROP TYPE', 'ALTER DOMAIN', 'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION', 'CREATE VIEW',
                  'ALTER VIEW', 'DROP VIEW', 'CREATE MATERIALIZED VIEW', 'DROP MATERIALIZED VIEW', 'GRANT',
                  'REVOKE', 'DROP COLLATION', 'DROP OWNED', 'ALTER DEFAULT PRIVILEGES', 'COMMENT',
                  'CREATE POLICY', 'ALTER POLICY', 'DROP POLICY') THEN
        -- The tables the commands name (an index's table; sequences a serial column made are no change):
        -- only those are brought in step when every command names one (cow._refresh_for_ddl).
        dropped := coalesce(current_setting('cow._ddl_dropped', true), '');
        PERFORM set_config('cow._ddl_dropped', '', true);
        IF tg_tag IN ('ALTER TABLE', 'CREATE TABLE', 'CREATE INDEX', 'ALTER INDEX', 'COMMENT') AND dropped <> 'all' THEN
            SELECT array_agg(DISTINCT t.oid) FILTER (WHERE c.relkind <> 'S'),
                   bool_and(d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'i', 'S')
                            AND (c.relkind = 'S' OR (t.relkind = 'r' AND NOT t.relispartition)))
              INTO rels, targeted
            FROM pg_event_trigger_ddl_commands() d
            LEFT JOIN pg_class c ON d.classid = 'pg_class'::regclass AND c.oid = d.objid
            LEFT JOIN pg_index i ON i.indexrelid = c.oid
            LEFT JOIN pg_class t ON t.oid = coalesce(i.indrelid, c.oid);
            rels := coalesce(rels, '{}') || coalesce(string_to_array(nullif(dropped, ''), ',')::oid[], '{}');
        ELSIF tg_tag IN ('DROP TABLE', 'DROP INDEX') AND dropped <> 'all' THEN
            -- (A drop reports no command here: the tables are those whose views cow._ddl_start dropped, or
            -- whose indexes the text names.)
            rels := coalesce(string_to_array(nullif(dropped, ''), ',')::oid[], '{}');
            targeted := true;
        ELSIF tg_tag IN ('GRANT', 'REVOKE') AND cow._names_tables_only(current_query()) THEN
            -- (A GRANT reports no object: the tables are the enabled ones its text names; their views take the
            -- new privileges, cow._signature covers them.)
            rels := ARRAY(SELECT g.relid FROM cow.registry g
                          WHERE g.table_name = ANY (cow._name_candidates(current_query())::text[]));
            targeted := true;
        ELSIF tg_tag IN ('ALTER TYPE', 'DROP TYPE', 'ALTER DOMAIN', 'DROP DOMAIN', 'DROP SEQUENCE', 'DROP FUNCTION',
                         'DROP COLLATION', 'CREATE VIEW', 'ALTER VIEW', 'DROP VIEW', 'CREATE MATERIALIZED VIEW',
                         'DROP MATERIALIZED VIEW') THEN
            -- The tables whose base columns, defaults or constraints a CASCADE dropped (cow._ddl_drop), and
            -- those whose overlay view went with it; the twins of app views follow below.
            rels := coalesce(string_to_array(nullif(current_setting('cow._ddl_touched', true), ''), ',')::oid[],
                             '{}')
                    || ARRAY(SELECT g.relid FROM cow.registry g
                             WHERE NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                               WHERE n.nspname = g.overlay_schema AND c.relname = g.table_name));
            targeted := true;
        END IF;
        PERFORM set_config('cow._ddl_touched', '', true);
        IF coalesce(targeted, false) THEN
            FOR note IN SELECT * FROM cow._refresh_for_ddl(rels) LOOP
                RAISE NOTICE 'cowproxy: %', note;
            END LOOP;
            IF tg_tag LIKE '% VIEW' THEN
                FOR note IN SELECT * FROM cow._app_views_changed() LOOP
                    RAISE NOTICE 'cowproxy: %', note;
                END LOOP;
            END IF;
        ELSE
            FOR note IN SELECT * FROM cow._refresh() LOOP
                RAISE NOTICE 'cowproxy: %', note;
            END LOOP;
        END IF;
    END IF;
END $gen$;

-- The twins after DDL of app views (cow._build_twins, with the layer's own DDL kept from its event triggers).
CREATE OR REPLACE FUNCTION cow._app_views_changed() RETURNS SETOF text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET client_min_messages = warning AS $gen$
DECLARE
    prev text := current_setting('cow.in_layer', true);
BEGIN
    PERFORM set_config('cow.in_layer', 'on', true);
    RETURN QUERY SELECT * FROM cow._build_twins();
    PERFORM set_config('cow.in_layer', coalesce(prev, ''), true);
END $gen$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_drop') THEN
        CREATE EVENT TRIGGER cow_ddl_drop ON sql_drop EXECUTE FUNCTION cow._ddl_drop();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_start') THEN
        CREATE EVENT TRIGGER cow_ddl_start ON ddl_command_start EXECUTE FUNCTION cow._ddl_start();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'cow_ddl_end') THEN
        CREATE EVENT TRIGGER cow_ddl_end ON ddl_command_end EXECUTE FUNCTION cow._ddl_end();
    END IF;
END $$;
