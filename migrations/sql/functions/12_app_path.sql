-- cowproxy copy-on-write layer: the application's own search_path inside a session.
-- A repeatable file (docs/layer.md, "Migrations").
--
-- In a session the physical search_path is the overlay path: each enabled schema's overlay schema right before
-- it, so unqualified names of copy-on-write tables resolve to their overlay views. The application's own
-- (logical) path is kept in the GUC cow.app_search_path, which is what introspection presents. When the
-- application sets its path in a session (through the proxy: SET/RESET search_path, set_config), the proxy
-- runs the application's own statement and then cow._adopt_app_path, so PostgreSQL normalises the path as it
-- would outside a session.

-- A path's entries without overlay schemas: of its entries, and of path p.
CREATE OR REPLACE FUNCTION cow._app_entries(entries text[]) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(e ORDER BY ord), '{}')
    FROM unnest(entries) WITH ORDINALITY AS t(e, ord)
    WHERE NOT EXISTS (SELECT 1 FROM cow.schemas s WHERE s.overlay_schema = t.e)
$$;

CREATE OR REPLACE FUNCTION cow._app_path_entries(p text) RETURNS text[]
LANGUAGE sql STABLE AS $$ SELECT cow._app_entries(cow._path_entries(p)) $$;

-- The overlay path of path p: overlay schemas named in p are dropped, then each enabled schema gets its
-- overlay right before it ("$user" stands for the schema named like current_user). A schema that is not
-- enabled gets none: its tables are read as they are. They have no guard (the layer puts none outside the
-- schemas it is installed on), so the proxy refuses writes to them: by a schema-qualified name from the
-- statement alone, by an unqualified name after asking cow._unlayered_write where the name resolves.
-- cow._overlay_path_of takes the entries without overlay schemas (cow._join has them at hand).
CREATE OR REPLACE FUNCTION cow._overlay_path_of(app_entries text[]) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    result text[] := '{}';
    e text;
    ov text;
BEGIN
    FOREACH e IN ARRAY app_entries LOOP
        SELECT overlay_schema INTO ov FROM cow.schemas
        WHERE schema_name = CASE WHEN e = '$user' THEN current_user::text ELSE e END;
        IF ov IS NOT NULL AND NOT ov = ANY (result) THEN
            result := result || ov;
        END IF;
        result := result || e;
    END LOOP;
    RETURN cow._path_text(result);
END $$;

CREATE OR REPLACE FUNCTION cow._overlay_path(p text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._overlay_path_of(cow._app_path_entries(p)) $$;

-- After the application set search_path (the value in force now is its own path): in a session, keep that
-- path in cow.app_search_path and put the overlay path in force, both with the scope of the application's
-- statement (p_local: SET LOCAL, set_config(..., true); both revert together at the end of the transaction,
-- and a rollback undoes both). Outside a session nothing changes. Returns the application's path as
-- PostgreSQL shows it.
CREATE OR REPLACE FUNCTION cow._adopt_app_path(p_local boolean) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    app text := current_setting('search_path');
BEGIN
    IF cow._session() IS NULL THEN
        RETURN app;
    END IF;
    -- The layer's own schemas stay out of reach: unqualified names would resolve to its tables.
    IF EXISTS (SELECT 1 FROM unnest(cow._path_entries(app)) AS e WHERE e IN ('cow', 'cow_changes')) THEN
        RAISE EXCEPTION 'cowproxy: search_path % names a schema of the copy-on-write layer: refused in a session', app
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF cardinality(cow._app_path_entries(app)) <> cardinality(cow._path_entries(app)) THEN
        app := cow._path_text(cow._app_path_entries(app));  -- (the application named an overlay schema)
    END IF;
    PERFORM set_config('cow.app_search_path', app, coalesce(p_local, false));
    PERFORM set_config('search_path', cow._overlay_path(app), coalesce(p_local, false));
    RETURN app;
END $$;

-- set_config('search_path', p, p_local) of the application in a session (the proxy sends this instead):
-- returns what set_config returns, the application's path.
CREATE OR REPLACE FUNCTION cow.set_app_path(p text, p_local boolean) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.set_config('search_path', p, coalesce(p_local, false));
    RETURN cow._adopt_app_path(p_local);
END $$;

-- For the proxy, before a write by unqualified relation names in a session: NULL when no schema on the
-- search_path in force lacks the layer (an unqualified name then resolves to an overlay view, a temporary
-- table, a guarded base table or a system catalog: nothing that writes the base rows silently); otherwise
-- {schema, name} of the first of p_names that resolves, as PostgreSQL resolves it for this role now, to a
-- relation in a schema without the layer, or '{}' when none does. Schemas the role may not use are skipped
-- by to_regclass as by the statement itself.
CREATE OR REPLACE FUNCTION cow._unlayered_write(p_names text[]) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    e text;
    n text;
    found_schema text;
    clean boolean := true;
BEGIN
    -- (Entry by entry, with one query each: the proxy asks this right after the join of each new connection,
    -- where one query joining the path's entries to pg_namespace cost ~2.5 M instructions to plan;
    -- docs/benchmarks.md, "The join in a new backend".)
    FOREACH e IN ARRAY cow._path_entries(current_setting('search_path')) LOOP
        e := CASE WHEN e = '$user' THEN current_user::text ELSE e END;
        IF NOT cow._layered_schema(e)
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_namespace ns WHERE ns.nspname = e) THEN
            clean := false;
            EXIT;
        END IF;
    END LOOP;
    IF clean THEN
        RETURN NULL;
    END IF;
    FOREACH n IN ARRAY coalesce(p_names, '{}') LOOP
        SELECT ns.nspname INTO found_schema
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
        WHERE c.oid = pg_catalog.to_regclass(pg_catalog.quote_ident(n));
        IF found_schema IS NOT NULL AND NOT cow._layered_schema(found_schema) THEN
            RETURN ARRAY[found_schema, n];
        END IF;
    END LOOP;
    RETURN '{}';
END $$;

-- A schema where an unqualified write cannot change base rows unguarded: one with the layer, an overlay
-- schema, the system catalog, a temporary schema (the session's own temporary tables). (plpgsql: a backend
-- plans its query once; a SQL function with a sub-select is not inlined, and was planned at each call.)
CREATE OR REPLACE FUNCTION cow._layered_schema(s text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN s = 'pg_catalog' OR starts_with(s, 'pg_temp') OR starts_with(s, 'pg_toast')
        OR EXISTS (SELECT 1 FROM cow.schemas x WHERE x.schema_name = s OR x.overlay_schema = s);
END $$;
