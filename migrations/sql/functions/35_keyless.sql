-- cowproxy copy-on-write layer: tables without a key ("keyless": no primary key, no unique index).
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).
--
-- A keyless table is a multiset of row values: identical rows are indistinguishable to a client, so a row is
-- identified by its whole value, compared with `=` on the table's composite type (record_eq: NULL-safe,
-- hashable). The registry marks such a table with pk_columns = '{}'. Its changes table has the keyed shape;
-- its rows mean:
-- - an added row value: _cow_deleted false, _cow_current true while the session has not removed it again;
-- - a tombstone, "one base instance of this value removed": _cow_deleted and _cow_current true;
-- - a log entry of a removal that retired one of the session's own added instances: _cow_deleted true,
--   _cow_current false, _cow_origin {"retires": <its _cow_seq>} (commit with operations needs the link).
-- A removal of value V (a DELETE, the OLD side of an UPDATE) retires the session's latest added instance of V
-- if it has one, else records a tombstone; the view hides as many base instances of V as there are tombstones.
-- The keyed view shape and the keyed UPDATE and DELETE generators (30_generators.sql) are not used for these
-- tables; the steps that collect a table's context (cow._build_triggers), the INSERT generator and the
-- FOREIGN KEY checks are shared.

-- Whether values of type p_type compare with `=` (a default btree operator class, through domains, arrays,
-- ranges and composite types): record_eq over the table's row type needs it for every column.
CREATE OR REPLACE FUNCTION cow._kl_type_ok(p_type oid) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t pg_type;
BEGIN
    SELECT * INTO STRICT t FROM pg_type WHERE oid = p_type;
    IF EXISTS (SELECT 1 FROM pg_opclass o JOIN pg_am a ON a.oid = o.opcmethod
               WHERE a.amname = 'btree' AND o.opcdefault
                 AND (o.opcintype = p_type OR EXISTS (SELECT 1 FROM pg_cast k WHERE k.castsource = p_type
                                                      AND k.casttarget = o.opcintype AND k.castmethod = 'b'))) THEN
        RETURN true;
    END IF;
    RETURN CASE
        WHEN t.typtype = 'd' THEN cow._kl_type_ok(t.typbasetype)
        WHEN t.typtype = 'e' THEN true
        WHEN t.typtype = 'c' THEN NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0
                                              AND NOT a.attisdropped AND NOT cow._kl_type_ok(a.atttypid))
        WHEN t.typtype = 'r' THEN cow._kl_type_ok((SELECT rngsubtype FROM pg_range WHERE rngtypid = p_type))
        WHEN t.typtype = 'm' THEN cow._kl_type_ok((SELECT rngtypid FROM pg_range WHERE rngmultitypid = p_type))
        WHEN t.typelem <> 0 AND t.typsubscript = 'array_subscript_handler'::regproc THEN cow._kl_type_ok(t.typelem)
        ELSE false END;
END $$;

-- Why table p_rel (without a primary key) cannot be enabled as a keyless table, or NULL when it can.
CREATE OR REPLACE FUNCTION cow._kl_refusal(p_rel oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    cols text;
BEGIN
    -- (A UNIQUE index over nullable columns is no key; checking it against base + session is not done. One
    -- that can be the key, cow._key_index, makes the table a keyed one: the notice says why each cannot.)
    IF EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = p_rel AND (i.indisunique OR i.indisexclusion)) THEN
        RETURN format('has no primary key or NOT NULL unique index, and a UNIQUE index or exclusion constraint '
                      'that cannot be its key (not supported without a key%s)',
                      coalesce(': ' || cow._key_rejects(p_rel), ''));
    END IF;
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
    INTO cols FROM pg_attribute a
    WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped AND NOT cow._kl_type_ok(a.atttypid);
    IF cols IS NOT NULL THEN
        RETURN format('has no primary key and columns whose type has no equality operator (%s): its rows cannot be '
                      'told apart', cols);
    END IF;
    RETURN NULL;
END $$;

-- Drop the per-table objects of registry entry p_id and the entry itself (the table leaves the layer or
-- changes kind: it got or lost its primary key, or a keyless table became one that cannot be enabled).
-- Refuses (0A000) while sessions hold changes to it: they were recorded for the other kind.
CREATE OR REPLACE FUNCTION cow._kl_unregister(p_id int, p_why text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r cow.registry%ROWTYPE;
    holders text;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    IF to_regclass(format('cow_changes.%I', r.changes_table)) IS NOT NULL THEN
        EXECUTE format('SELECT string_agg(DISTINCT _cow_session, '', '') FROM cow_changes.%I', r.changes_table)
        INTO holders;
    END IF;
    IF holders IS NOT NULL THEN
        RAISE EXCEPTION 'cowproxy: table %.% %, but sessions hold changes to it: %', quote_ident(r.table_schema),
            quote_ident(r.table_name), p_why, holders
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'commit or discard those sessions first (their changes were recorded for the table as it was)';
    END IF;
    PERFORM cow._unregister(p_id);
END $$;

-- cow._register of a table already in the registry: when its kind changed (a primary key added to a keyless
-- table or dropped from a keyed one, or a keyless table that can no longer be enabled), its objects are
-- dropped (cow._kl_unregister) and true is returned: the caller registers it anew.
CREATE OR REPLACE FUNCTION cow._kl_recheck(p_rel oid) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r cow.registry%ROWTYPE;
    keyless boolean := cow._pk_columns(p_rel) IS NULL;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE relid = p_rel;
    IF (r.pk_columns = '{}') = keyless AND NOT (keyless AND cow._kl_refusal(p_rel) IS NOT NULL) THEN
        RETURN false;
    END IF;
    -- (The key: a primary key, or a NOT NULL unique index that stands in for it, cow._key_index.)
    PERFORM cow._kl_unregister(r.id, CASE WHEN r.pk_columns = '{}' AND NOT keyless THEN 'got a key'
                                          WHEN NOT keyless THEN 'changed'
                                          WHEN r.pk_columns <> '{}' THEN 'lost its key'
                                          ELSE cow._kl_refusal(p_rel) END);
    RETURN true;
END $$;

-- "ROW(c.a, c.b)::<table type>": the row value of changes-table row `c` as a value of the base table's row type,
-- which `=` compares with a base row like record_eq: NULL-safe and hashable. (A base row's whole-row reference
-- is always spelled with a `_cow_` alias: a bare alias like `b` would be the column `b` if the table has one,
-- and app columns named _cow_* are refused.)
CREATE OR REPLACE FUNCTION cow._kl_value(names text[], r text, b text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('ROW(%s)::%s', cow._collist(names, r || '.'), b)
$$;

-- "l.a = r.a AND ...": equalities of the NOT NULL columns of table p_rel (NULL: none), added next to a row
-- comparison (which they imply) so that a lookup of one value can use an index on such a column of the base
-- table or a mirror of it on the changes table (`=` on the row type uses no index).
CREATE OR REPLACE FUNCTION cow._kl_nn_eq(p_rel oid, l text, r text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT string_agg(format('%s.%I = %s.%I', l, a.attname, r, a.attname), ' AND ' ORDER BY a.attnum)
    FROM pg_attribute a WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull
$$;

-- The changes table and overlay view of keyless registry entry p_id. The view is the base rows (less one
-- instance per tombstone of the session) plus the session's added rows, in three UNION ALL leaves:
-- - the base rows whose value the session removed nothing of: `NOT (row IN (tombstones))`, a hashed subplan
--   on the row type's hash (NULL-safe, since record_eq treats NULLs as equal, and a whole row is never
--   NULL), behind a one-time test that the session has any tombstone at all, so a session that removed
--   nothing pays no per-row hash (count(*) of 1M rows on 15: 90 ms against 42-50 plain, 290 ms with the
--   NOT EXISTS anti join, which hashes every base row even when the other side is empty);
-- - the surviving instances of each removed value: per value its base instances are counted (a join of the
--   tombstones, grouped by value, with the base table: hashed, or per value by an index on a NOT NULL
--   column) and generate_series emits count - tombstones copies: only rows whose value was removed are
--   counted, nothing is numbered;
-- - the session's added rows.
CREATE OR REPLACE FUNCTION cow._kl_build_view(p_id int) RETURNS void
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
    sess text := $$pg_catalog.current_setting('cow.session_id', true)$$;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    rel := r.relid;
    SELECT n2.nspname, c.relname INTO sch, tab FROM pg_class c JOIN pg_namespace n2 ON n2.oid = c.relnamespace
    WHERE c.oid = rel;
    ch := format('cow_changes.%I', r.changes_table);
    b := format('%I.%I', sch, tab);
    EXECUTE format('DROP VIEW IF EXISTS %I.%I CASCADE', r.overlay_schema, r.table_name);
    SELECT c.names, c.types, c.nums INTO names, types, nums FROM cow._base_columns(rel) c;
    PERFORM cow._changes_table(r, names, types, nums);
    v := format('%I.%I', r.overlay_schema, tab);
    EXECUTE cow._fill($t$CREATE VIEW {{view}} AS SELECT {{base_columns}} FROM {{base}} _cow_b
WHERE (SELECT NOT EXISTS (SELECT 1 {{tombstones}})) OR NOT (_cow_b IN (SELECT {{tombstone_value}} {{tombstones}}))
UNION ALL SELECT {{survivor_columns}} FROM (SELECT t._cow_v, t._cow_n, count(*) AS _cow_have
    FROM (SELECT {{tombstone_value}} AS _cow_v, count(*) AS _cow_n {{tombstones}} GROUP BY 1) t
    JOIN {{base}} _cow_b ON _cow_b = t._cow_v{{not_null_equal}} GROUP BY t._cow_v, t._cow_n) k
    CROSS JOIN LATERAL pg_catalog.generate_series(1, k._cow_have - k._cow_n)
UNION ALL SELECT {{changes_columns}} FROM {{changes}} c WHERE {{gate}} AND c._cow_session = {{session}} AND c._cow_current AND NOT c._cow_deleted$t$,
        jsonb_build_object(
            'view', v,
            'base_columns', cow._collist(names, '_cow_b.'),
            'base', b,
            'tombstones', format('FROM %s x WHERE %s AND x._cow_session = %s AND x._cow_current AND x._cow_deleted', ch, cow._read_gate_sql(), sess),
            'tombstone_value', cow._kl_value(names, 'x', b),
            'survivor_columns', (SELECT string_agg(format('(k._cow_v).%I', n2), ', ' ORDER BY j)
                                 FROM unnest(names) WITH ORDINALITY AS u(n2, j)),
            'not_null_equal', coalesce(' AND ' || cow._kl_nn_eq(rel, '_cow_b', '(t._cow_v)'), ''),
            'changes_columns', cow._collist(names, 'c.'),
            'changes', ch,
            'gate', cow._read_gate_sql(),
            'session', sess));
    PERFORM cow._view_defaults(rel, v, b, r.changes_table);
    UPDATE cow.registry SET table_schema = sch, table_name = tab, pk_columns = '{}', col_attnums = nums,
                            col_names = names, col_types = types
    WHERE id = p_id;
END $gen$;

-- The removal of one instance of OLD from keyless table `c`: the session's latest added instance of the value
-- stops being current (_ret: its _cow_seq; a log entry links to it), else a tombstone of one base instance
-- (_cow_base: the value, for diff). _pfk: the retired instance's FOREIGN KEY bits (its deferred checks go
-- with NEW).
CREATE OR REPLACE FUNCTION cow._kl_removal(c cow.trigger_context) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
RETURN cow._fill($t$    _ret := NULL;
    _pfk := NULL;
    UPDATE {{changes}} x SET _cow_current = false WHERE x._cow_current AND x.ctid = (SELECT y.ctid FROM {{changes}} y
        WHERE y._cow_session = _s AND y._cow_current AND NOT y._cow_deleted AND {{value}} = {{old_value}}{{not_null_equal}} ORDER BY y._cow_seq DESC LIMIT 1)
        RETURNING x._cow_seq, x._cow_fk INTO _ret, _pfk;
    INSERT INTO {{changes}} (_cow_session, _cow_op, _cow_deleted, _cow_current, _cow_base, _cow_origin, {{columns}})
    VALUES (_s, _o, true, _ret IS NULL, CASE WHEN _ret IS NULL THEN pg_catalog.to_jsonb(OLD) END,
            CASE WHEN _ret IS NOT NULL THEN pg_catalog.jsonb_build_object('retires', _ret) END, {{old_values}});
$t$, jsonb_build_object(
    'changes', c.ch,
    'value', cow._kl_value(c.names, 'y', c.b),
    'old_value', cow._kl_value(c.names, 'OLD', c.b),
    'not_null_equal', coalesce(' AND ' || cow._kl_nn_eq(c.rel, 'y', 'OLD'), ''),
    'columns', cow._collist(c.names),
    'old_values', cow._collist(c.names, 'OLD.')));

-- UPDATE of a keyless table: without a session the overlay view writes the base table like the keyed ones, one
-- instance of the row value; in a session, the removal of OLD and an added NEW.
CREATE OR REPLACE FUNCTION cow._kl_gen_update(c cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fn text := format('cow_changes.%I', c.changes_table || '_upd');
BEGIN
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
{{declare}}BEGIN
{{registry_check}}{{defaults}}    IF _s IS NULL THEN
        UPDATE {{base}} AS y SET ({{set_columns}}) = ROW({{set_values}}) WHERE (y.tableoid, y.ctid) = (SELECT _cow_z.tableoid, _cow_z.ctid FROM {{base}} _cow_z WHERE _cow_z = {{old_value}} LIMIT 1) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
{{generated}}{{not_null}}{{checks}}{{removal}}    INSERT INTO {{changes}} (_cow_session, _cow_op, _cow_deleted, _cow_fk, {{columns}}) VALUES (_s, _o, false, {{fk_bits}}, {{values}});
    RETURN NEW;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', fn,
        'declare', c.decl,
        'registry_check', c.reg_code,
        'defaults', c.dflt_upd,
        'base', c.b,
        'set_columns', cow._collist(c.setcols),
        'set_values', cow._collist(c.setcols, 'NEW.'),
        'old_value', cow._kl_value(c.names, 'OLD', c.b),
        'generated', c.gen_code,
        'not_null', c.nn_code,
        'checks', c.chk_code,
        'removal', cow._kl_removal(c),
        'changes', c.ch,
        'columns', cow._collist(c.names),
        'fk_bits', CASE WHEN c.fk_n = 0 THEN '0' WHEN c.dbits = '0' THEN c.fk_changed
                        ELSE format('%s | (coalesce(_pfk, 0) & (%s))', c.fk_changed, c.dbits) END,
        'values', cow._collist(c.names, 'NEW.')));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_update INSTEAD OF UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', c.v, fn);
END $gen$;

-- DELETE of a keyless table: one instance of the row value, in the base table or in the session.
CREATE OR REPLACE FUNCTION cow._kl_gen_delete(c cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fn text := format('cow_changes.%I', c.changes_table || '_del');
BEGIN
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
{{declare}}BEGIN
{{registry_check}}    IF _s IS NULL THEN
        DELETE FROM {{base}} AS y WHERE (y.tableoid, y.ctid) = (SELECT _cow_z.tableoid, _cow_z.ctid FROM {{base}} _cow_z WHERE _cow_z = {{old_value}} LIMIT 1);
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
    _o := cow._write_operation();
{{removal}}    RETURN OLD;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', fn,
        'declare', c.decl,
        'registry_check', c.reg_code,
        'base', c.b,
        'old_value', cow._kl_value(c.names, 'OLD', c.b),
        'removal', cow._kl_removal(c)));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_delete INSTEAD OF DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', c.v, fn);
END $gen$;

-- cow.commit_session's part for keyless table g: p_deletes true removes one base instance per tombstone of the
-- session (of operations `chosen`, all when NULL), each a row that equals the value, found by (tableoid,
-- ctid) and locked FOR UPDATE, and raises 40001 naming the table and the value when no instance is left
-- (unless on_conflict is 'overwrite': then what is left goes); p_deletes false inserts the added rows, in
-- write order (with operations: also those a later operation that is not committed removed again, which stays
-- in the session as a tombstone of the now committed row, cow._kl_commit_rebase). Returns the row count.
CREATE OR REPLACE FUNCTION cow._kl_commit(g cow.registry, session text, chosen text[], on_conflict text,
                                          p_deletes boolean) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b text := format('%I.%I', g.table_schema, g.table_name);
    ncols text[];
    has_always boolean;
    vtxt text;
    want bigint;
    got bigint;
    total bigint := 0;
BEGIN
    IF p_deletes THEN
        -- (The value goes through its text form, which is exact for every type (what pg_dump relies on), not
        -- jsonb: float8 through jsonb keeps 15 digits. A record variable would do, but plpgsql keeps the type
        -- of its fields' parameters from the first call.)
        FOR vtxt, want IN EXECUTE format(
                'SELECT s.v::text, count(*) FROM (SELECT %s AS v, c._cow_seq FROM cow_changes.%I c '
                'WHERE c._cow_session = $1 AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) AND c._cow_current '
                'AND c._cow_deleted) s GROUP BY s.v ORDER BY min(s._cow_seq)',
                cow._kl_value(g.col_names, 'c', b), g.changes_table)
            USING session, chosen LOOP
            EXECUTE format('WITH d AS (DELETE FROM %1$s y USING (SELECT _cow_z.tableoid AS t, _cow_z.ctid AS c FROM %1$s _cow_z '
                           'WHERE _cow_z = $1::%1$s%2$s LIMIT $2 FOR UPDATE) x '
                           'WHERE y.tableoid = x.t AND y.ctid = x.c RETURNING 1) SELECT count(*) FROM d',
                           b, coalesce(' AND ' || cow._kl_nn_eq(g.relid, '_cow_z', format('($1::%s)', b)), ''))
            INTO got USING vtxt, want;
            IF got < want AND on_conflict = 'fail' THEN
                RAISE EXCEPTION 'could not commit session %: row % of table % changed in base since the session deleted it (% of the % instance(s) it deleted left)',
                    session, vtxt, b, got, want
                    USING ERRCODE = 'serialization_failure',
                          HINT = 'discard the session, or commit with on_conflict => ''overwrite'' (--on-conflict overwrite)';
            END IF;
            total := total + got;
        END LOOP;
        RETURN total;
    END IF;
    SELECT array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = ''), bool_or(a.attidentity = 'a')
    INTO ncols, has_always
    FROM pg_attribute a WHERE a.attrelid = g.relid AND a.attnum > 0 AND NOT a.attisdropped;
    EXECUTE format('WITH i AS (INSERT INTO %1$s (%2$s) %3$s SELECT %4$s FROM cow_changes.%5$I c '
                   'WHERE c._cow_session = $1 AND NOT c._cow_deleted AND ($2::text[] IS NULL OR c._cow_op = ANY ($2)) '
                   'AND (c._cow_current OR ($2::text[] IS NOT NULL AND EXISTS (SELECT 1 FROM cow_changes.%5$I t '
                   'WHERE t._cow_session = $1 AND t._cow_deleted AND NOT t._cow_current AND NOT t._cow_op = ANY ($2) '
                   'AND t._cow_origin = jsonb_build_object(''retires'', c._cow_seq)))) '
                   'ORDER BY c._cow_seq RETURNING 1) SELECT count(*) FROM i',
                   b, cow._collist(ncols), CASE WHEN has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END,
                   cow._collist(ncols, 'c.'), g.changes_table)
    INTO total USING session, chosen;
    RETURN total;
END $$;

-- After a commit of operations `chosen`: a removal by an operation left in the session that retired a row
-- value one of them added (now a base row) becomes a tombstone of that base row; then the committed
-- operations' entries go. Returns the entries left.
CREATE OR REPLACE FUNCTION cow._kl_commit_rebase(g cow.registry, session text, chosen text[]) RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('UPDATE cow_changes.%1$I t SET _cow_current = true, _cow_origin = NULL, '
                   '_cow_base = to_jsonb(t.*) - cow._meta_columns() '
                   'WHERE t._cow_session = $1 AND t._cow_deleted AND NOT t._cow_current AND NOT t._cow_op = ANY ($2) '
                   'AND (t._cow_origin ->> ''retires'')::bigint IN (SELECT c._cow_seq FROM cow_changes.%1$I c '
                   'WHERE c._cow_session = $1 AND c._cow_op = ANY ($2))', g.changes_table)
    USING session, chosen;
    EXECUTE format('DELETE FROM cow_changes.%I WHERE _cow_session = $1 AND _cow_op = ANY ($2)', g.changes_table)
    USING session, chosen;
    EXECUTE format('SELECT count(*) FROM cow_changes.%I WHERE _cow_session = $1', g.changes_table) INTO n USING session;
    RETURN n;
END $$;
