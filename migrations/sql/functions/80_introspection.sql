-- cowproxy copy-on-write layer: catalog answers as outside a session (docs/layer.md, "Introspection in a session").
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).
--
-- In a session the physical search_path has each enabled schema's overlay schema before it, so PostgreSQL's own
-- name resolution (regclass input, to_regclass, pg_table_is_visible, current_schema(), pg_get_serial_sequence,
-- pg_get_constraintdef's names) answers with the overlay views. The proxy points those calls of a tagged
-- connection at the functions below, which answer with the application's own path: cow.app_search_path, kept by
-- the layer while in a session (fallback: the physical path without overlay schemas). Each inner function has a
-- SET search_path clause and sets the application's path inside it: PostgreSQL restores the caller's path when
-- the function returns (also on error), so the statement around it still reads the overlay views.

-- The application's search_path: cow.app_search_path in a session, else the path without overlay schemas.
CREATE OR REPLACE FUNCTION cow.app_search_path() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('cow.app_search_path', true), ''), cow._session_path(false))
$$;

-- With p_implicit, the backend's temporary schema is left out while it holds nothing: the binding made it
-- (cow._bind), not the application (on the plain tables it appears with the first temporary table).
CREATE OR REPLACE FUNCTION cow._current_schemas(p_path text, p_implicit boolean) RETURNS name[]
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t oid := pg_my_temp_schema();
BEGIN
    PERFORM set_config('search_path', p_path, true);
    IF p_implicit AND t <> 0 AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = t) THEN
        RETURN array_remove(current_schemas(true), (SELECT n.nspname FROM pg_namespace n WHERE n.oid = t));
    END IF;
    RETURN current_schemas(p_implicit);
END $$;

CREATE OR REPLACE FUNCTION cow.current_schemas(p_implicit boolean) RETURNS name[]
LANGUAGE sql STABLE AS $$ SELECT cow._current_schemas(cow.app_search_path(), p_implicit) $$;

CREATE OR REPLACE FUNCTION cow.current_schema() RETURNS name
LANGUAGE sql STABLE AS $$ SELECT (cow._current_schemas(cow.app_search_path(), false))[1] $$;

CREATE OR REPLACE FUNCTION cow._table_is_visible(p_path text, p_rel oid) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_table_is_visible(p_rel);
END $$;

-- Every relation under the application's path, as outside the session. (An inlined SQL body, no subquery: a
-- catalog scan calls it per row, and the old test "is the relation in an app or overlay schema", there to
-- spare the catalogs' rows the change of path, cost ~6 us a row against ~1.2 for the change itself.)
CREATE OR REPLACE FUNCTION cow.pg_table_is_visible(p_rel oid) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT cow._table_is_visible(cow.app_search_path(), p_rel) $$;

-- The relations visible under a path, computed once: for each name, the relation of the first schema of
-- current_schemas(true) that has one (the implicit pg_catalog and temporary schema where PostgreSQL puts them),
-- which is pg_table_is_visible's rule. The proxy writes a pg_table_is_visible(x) that is a conjunct of a WHERE
-- or JOIN ... ON as x IN (SELECT cow.visible_relations()): one set per statement instead of a change of path
-- per row (docs/rewrites.md, "Introspection").
CREATE OR REPLACE FUNCTION cow._visible_relations(p_path text) RETURNS SETOF oid
LANGUAGE plpgsql STABLE ROWS 2000 SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    schemas oid[];
BEGIN
    PERFORM set_config('search_path', p_path, true);
    SELECT array_agg(n.oid ORDER BY s.pos) INTO schemas
    FROM unnest(current_schemas(true)) WITH ORDINALITY AS s (nspname, pos)
    JOIN pg_namespace n ON n.nspname = s.nspname;
    -- the query's own names resolve on the function's path, not the application's
    PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
    RETURN QUERY
        SELECT DISTINCT ON (c.relname) c.oid
        FROM pg_class c
        WHERE c.relnamespace = ANY (schemas)
        ORDER BY c.relname, array_position(schemas, c.relnamespace);
END $$;

CREATE OR REPLACE FUNCTION cow.visible_relations() RETURNS SETOF oid
LANGUAGE sql STABLE ROWS 2000 AS $$ SELECT cow._visible_relations(cow.app_search_path()) $$;

CREATE OR REPLACE FUNCTION cow._type_is_visible(p_path text, p_type oid) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_type_is_visible(p_type);
END $$;

CREATE OR REPLACE FUNCTION cow.pg_type_is_visible(p_type oid) RETURNS boolean
LANGUAGE sql STABLE AS $$ SELECT cow._type_is_visible(cow.app_search_path(), p_type) $$;

-- 'name'::regclass: the type's input function, as for a literal (a number is an oid; 42P01 for a relation that
-- does not exist). A cast of text would not take oids.
CREATE OR REPLACE FUNCTION cow._regclass(p_path text, p_name text) RETURNS regclass
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN regclassin(p_name::cstring);
END $$;

CREATE OR REPLACE FUNCTION cow.regclass(p_name text) RETURNS regclass
LANGUAGE sql STABLE AS $$ SELECT cow._regclass(cow.app_search_path(), p_name) $$;

CREATE OR REPLACE FUNCTION cow._to_regclass(p_path text, p_name text) RETURNS regclass
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN to_regclass(p_name);
END $$;

CREATE OR REPLACE FUNCTION cow.to_regclass(p_name text) RETURNS regclass
LANGUAGE sql STABLE AS $$ SELECT cow._to_regclass(cow.app_search_path(), p_name) $$;

-- 'name'::regtype and to_regtype(): a CoW table's row type resolves to the table's, not the overlay view's.
CREATE OR REPLACE FUNCTION cow._regtype(p_path text, p_name text, p_strict boolean) RETURNS regtype
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    IF p_strict THEN
        RETURN regtypein(p_name::cstring);
    END IF;
    RETURN to_regtype(p_name);
END $$;

CREATE OR REPLACE FUNCTION cow.regtype(p_name text) RETURNS regtype
LANGUAGE sql STABLE AS $$ SELECT cow._regtype(cow.app_search_path(), p_name, true) $$;

CREATE OR REPLACE FUNCTION cow.to_regtype(p_name text) RETURNS regtype
LANGUAGE sql STABLE AS $$ SELECT cow._regtype(cow.app_search_path(), p_name, false) $$;

CREATE OR REPLACE FUNCTION cow._pg_get_serial_sequence(p_path text, p_table text, p_column text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_get_serial_sequence(p_table, p_column);
END $$;

CREATE OR REPLACE FUNCTION cow.pg_get_serial_sequence(p_table text, p_column text) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._pg_get_serial_sequence(cow.app_search_path(), p_table, p_column) $$;

-- pg_get_constraintdef names a referenced table with its schema when the path does not show it (in a session
-- the overlay view shadows it): "REFERENCES authors(id)" as outside, not "REFERENCES public.authors(id)".
CREATE OR REPLACE FUNCTION cow._pg_get_constraintdef(p_path text, p_constraint oid, p_pretty boolean) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_get_constraintdef(p_constraint, p_pretty);
END $$;

CREATE OR REPLACE FUNCTION cow.pg_get_constraintdef(p_constraint oid, p_pretty boolean DEFAULT false) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._pg_get_constraintdef(cow.app_search_path(), p_constraint, p_pretty) $$;

-- A relation's name as regclass output gives it outside a session ("books", not "public.books").
CREATE OR REPLACE FUNCTION cow._regclass_name(p_path text, p_rel oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN p_rel::regclass::text;
END $$;

CREATE OR REPLACE FUNCTION cow.regclass_name(p_rel oid) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._regclass_name(cow.app_search_path(), p_rel) $$;

-- setval() in a session only moves a sequence forward: the sequences of CoW tables are shared with the base
-- tables and with other sessions, and moving one back would hand out ids that rows elsewhere already have.
-- Returns what setval() returns (its second argument).
CREATE OR REPLACE FUNCTION cow.setval(p_seq regclass, p_value bigint, p_called boolean DEFAULT true) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    inc bigint;
    last_value bigint;
    called boolean;
BEGIN
    SELECT seqincrement INTO inc FROM pg_catalog.pg_sequence WHERE seqrelid = p_seq;
    IF inc IS NULL THEN
        RETURN pg_catalog.setval(p_seq, p_value, p_called);  -- not a sequence: PostgreSQL's own error
    END IF;
    EXECUTE format('SELECT last_value, is_called FROM %s', p_seq) INTO last_value, called;
    IF sign(inc) * ((CASE WHEN p_called THEN p_value + inc ELSE p_value END)
                    - (CASE WHEN called THEN last_value + inc ELSE last_value END)) > 0 THEN
        PERFORM pg_catalog.setval(p_seq, p_value, p_called);
    END IF;
    RETURN p_value;
END $$;

-- pg_get_triggerdef and pg_get_viewdef name relations as pg_get_constraintdef does.
CREATE OR REPLACE FUNCTION cow._pg_get_triggerdef(p_path text, p_trigger oid, p_pretty boolean) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_get_triggerdef(p_trigger, p_pretty);
END $$;

CREATE OR REPLACE FUNCTION cow.pg_get_triggerdef(p_trigger oid, p_pretty boolean DEFAULT false) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._pg_get_triggerdef(cow.app_search_path(), p_trigger, p_pretty) $$;

CREATE OR REPLACE FUNCTION cow._pg_get_viewdef(p_path text, p_view oid, p_pretty boolean) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM set_config('search_path', p_path, true);
    RETURN pg_get_viewdef(p_view, p_pretty);
END $$;

CREATE OR REPLACE FUNCTION cow.pg_get_viewdef(p_view oid, p_pretty boolean DEFAULT false) RETURNS text
LANGUAGE sql STABLE AS $$ SELECT cow._pg_get_viewdef(cow.app_search_path(), p_view, p_pretty) $$;
