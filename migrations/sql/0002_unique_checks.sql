-- cowproxy copy-on-write layer, version 2: partial and expression UNIQUE indexes and exclusion constraints are
-- checked inside sessions (23505 / 23P01), against the session's view of the table like the plain UNIQUE
-- checks of 0001. `install` applies this file and then calls cow.refresh(true), which regenerates every
-- table's triggers (and with them the changes tables' lookup indexes below) with this code.

-- The UNIQUE indexes that are partial or have expressions, and the indexes of exclusion constraints, of
-- table p_rel, in index creation order (PostgreSQL checks a row against its indexes in that order):
-- what a generated check and the changes table's lookup index need, as SQL text that names columns bare.
-- Called with search_path = pg_catalog, pg_temp (by the generators), so the expressions come out with their
-- functions and types schema-qualified unless they are in pg_catalog.
CREATE OR REPLACE FUNCTION cow._xindexes(p_rel oid)
RETURNS TABLE (idx oid, name text, excl boolean, nnd boolean, am text, multicol boolean, keys text[], ops text[],
               opclasses text[], pred text, display text, cols text[])
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT x.indexrelid, ic.relname::text, x.indisexclusion, x.indnullsnotdistinct, am.amname::text,
           pg_indexam_has_property(am.oid, 'can_multi_col'),
           -- "(expr) COLLATE c": the index's collation, so the lookup can use the index (and compares like it).
           ARRAY(SELECT format('(%s)', pg_get_indexdef(x.indexrelid, k, true))
                        || CASE WHEN x.indcollation[k - 1] <> 0
                                THEN ' COLLATE ' || (SELECT format('%I.%I', cn.nspname, co.collname)
                                                     FROM pg_collation co JOIN pg_namespace cn ON cn.oid = co.collnamespace
                                                     WHERE co.oid = x.indcollation[k - 1])
                                ELSE '' END
                 FROM generate_series(1, x.indnkeyatts) AS k ORDER BY k),
           -- The operator a key conflicts by: the exclusion operator, or the opclass's equality.
           ARRAY(SELECT (SELECT format('OPERATOR(%I.%s)', opn.nspname, o.oprname)
                         FROM pg_operator o JOIN pg_namespace opn ON opn.oid = o.oprnamespace
                         WHERE o.oid = CASE WHEN x.indisexclusion THEN cx.conexclop[k]
                                            ELSE (SELECT ao.amopopr FROM pg_amop ao
                                                  WHERE ao.amopfamily = oc.opcfamily AND ao.amoplefttype = oc.opcintype
                                                    AND ao.amoprighttype = oc.opcintype AND ao.amopstrategy = 3
                                                    AND ao.amopmethod = oc.opcmethod) END)
                 FROM generate_series(1, x.indnkeyatts) AS k
                 JOIN pg_opclass oc ON oc.oid = x.indclass[k - 1] ORDER BY k),
           ARRAY(SELECT format('%I.%I', ocn.nspname, oc.opcname)
                 FROM generate_series(1, x.indnkeyatts) AS k
                 JOIN pg_opclass oc ON oc.oid = x.indclass[k - 1] JOIN pg_namespace ocn ON ocn.oid = oc.opcnamespace
                 ORDER BY k),
           pg_get_expr(x.indpred, x.indrelid),
           -- As PostgreSQL names the key in the error detail: "lower(email::text), ws".
           (SELECT string_agg(pg_get_indexdef(x.indexrelid, k, true), ', ' ORDER BY k)
            FROM generate_series(1, x.indnkeyatts) AS k),
           -- Every column the index reads (keys, expressions, predicate): an UPDATE that changes none of them
           -- cannot create a conflict. Expression and predicate columns are in pg_depend (constraint keys
           -- under the constraint).
           ARRAY(SELECT a.attname::text FROM pg_attribute a
                 WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped
                   AND (a.attnum = ANY (x.indkey::int2[])
                        OR EXISTS (SELECT 1 FROM pg_depend d
                                   WHERE d.refclassid = 'pg_class'::regclass AND d.refobjid = p_rel
                                     AND d.refobjsubid = a.attnum
                                     AND ((d.classid = 'pg_class'::regclass AND d.objid = x.indexrelid)
                                          OR (d.classid = 'pg_constraint'::regclass AND d.objid = cx.oid))))
                 ORDER BY a.attnum)
    FROM pg_index x
    JOIN pg_class ic ON ic.oid = x.indexrelid
    JOIN pg_am am ON am.oid = ic.relam
    -- (An exclusion index belongs to an EXCLUDE constraint, or from PostgreSQL 18 to a PRIMARY KEY/UNIQUE
    -- constraint WITHOUT OVERLAPS: both store their operators in conexclop and report 23P01.)
    LEFT JOIN pg_constraint cx ON cx.conindid = x.indexrelid AND cx.conrelid = p_rel AND cx.contype IN ('x', 'p', 'u')
    WHERE x.indrelid = p_rel
      AND (x.indisexclusion OR (x.indisunique AND (x.indpred IS NOT NULL OR x.indexprs IS NOT NULL)))
    ORDER BY x.indexrelid
$$;

-- Lookup indexes on the changes table for those checks (name prefix `<t>_xq`, apart from _build_view's `<t>_u`
-- ones): the same keys (expressions, collations, opclasses) and predicate over the changes table's columns,
-- restricted to current, not deleted versions, so a check probes an index on both sides of the overlay view.
-- Btree (and any access method that has a default opclass for text, e.g. gist with btree_gist) leads with
-- the session. Idempotent: indexes are named by a hash of their definition; stale ones are dropped.
CREATE OR REPLACE FUNCTION cow._build_lookup_indexes(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    x record;
    def text;
    nm text;
    wanted text[] := '{}';
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    FOR x IN SELECT * FROM cow._xindexes(r.relid) LOOP
        def := format('ON cow_changes.%I USING %I (%s%s) WHERE _cow_current AND NOT _cow_deleted%s', r.changes_table,
                      x.am,
                      CASE WHEN x.am = 'btree' OR (x.multicol AND EXISTS (
                                SELECT 1 FROM pg_opclass oc JOIN pg_am a ON a.oid = oc.opcmethod
                                WHERE a.amname = x.am AND oc.opcintype = 'text'::regtype AND oc.opcdefault))
                           THEN '_cow_session, ' ELSE '' END,
                      (SELECT string_agg(x.keys[k] || ' ' || x.opclasses[k], ', ' ORDER BY k)
                       FROM generate_subscripts(x.keys, 1) AS k),
                      CASE WHEN x.pred IS NULL THEN '' ELSE format(' AND (%s)', x.pred) END);
        nm := r.changes_table || '_xq' || left(md5(def), 12);
        wanted := wanted || nm;
        IF to_regclass(format('cow_changes.%I', nm)) IS NULL THEN
            EXECUTE format('CREATE INDEX %I %s', nm, def);
        END IF;
    END LOOP;
    FOR x IN SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
             WHERE s.nspname = 'cow_changes' AND c.relkind = 'i' AND c.relname LIKE r.changes_table || '\_xq%'
               AND NOT c.relname = ANY (wanted) LOOP
        EXECUTE format('DROP INDEX cow_changes.%I', x.relname);
    END LOOP;
END $gen$;

-- The check of one index of cow._xindexes in a generated INSERT (p_upd false) or UPDATE trigger: evaluate the
-- predicate and keys on NEW; when the predicate holds and no key is NULL (NULLS NOT DISTINCT: NULLs match),
-- look for a row of the session's view with the predicate true and conflicting keys (an UPDATE skips its own
-- row, and runs only when a column the index reads changed). `var` is the record variable the generated
-- function declares for NEW's keys. The session's view is spelled out here rather than read through the
-- overlay view: base rows matched by the base's own index, each probed for a version of this session
-- (`OFFSET 0` keeps that a per-row index probe: through the view a generic plan may hash all of the
-- session's keys for a range overlap), plus the session's current versions matched by the lookup index.
CREATE OR REPLACE FUNCTION cow._xcheck_code(p_rel oid, p_idx oid, p_upd boolean, var text, b text, ch text,
                                            names text[], pk text[], sch text, tab text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
    n int;
    cond text;
    newkey text;
    code text;
    base_src text;
    sess_src text;
BEGIN
    SELECT * INTO STRICT x FROM cow._xindexes(p_rel) WHERE idx = p_idx;
    n := array_length(x.keys, 1);
    -- NULLS NOT DISTINCT: "key = value OR both NULL"; plpgsql's custom plans fold the NULL test per call, so
    -- the lookup stays an index probe (`= value` or `IS NULL`).
    SELECT string_agg(CASE WHEN x.nnd
                           THEN format('(%1$s %2$s %3$s.k%4$s OR (%3$s.k%4$s IS NULL AND %1$s IS NULL))',
                                       x.keys[k], x.ops[k], var, k)
                           ELSE format('%s %s %s.k%s', x.keys[k], x.ops[k], var, k) END,
                      ' AND ' ORDER BY k)
    INTO cond FROM generate_series(1, n) AS k;
    IF x.pred IS NOT NULL THEN
        cond := format('(%s) AND ', x.pred) || cond;
    END IF;
    -- The keys and predicate name columns bare: each source below has one relation in scope.
    base_src := format('%s b WHERE %s AND NOT EXISTS (SELECT 1 FROM %s c WHERE c._cow_session = _s AND c._cow_current AND %s OFFSET 0)%s',
                       b, cond, ch, cow._eq(pk, 'c', 'b'),
                       CASE WHEN p_upd THEN format(' AND NOT (%s)', cow._eq(pk, 'b', 'OLD')) ELSE '' END);
    sess_src := format('%s c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted AND %s%s',
                       ch, cond, CASE WHEN p_upd THEN format(' AND NOT (%s)', cow._eq(pk, 'c', 'OLD')) ELSE '' END);
    newkey := (SELECT string_agg(format('coalesce(%s.k%s::text, ''null'')', var, k), ', ' ORDER BY k)
               FROM generate_series(1, n) AS k);
    code := format(E'    SELECT %s AS p, %s INTO %s FROM (%s) AS _x;\n',
                   coalesce('(' || x.pred || ')', 'true'),
                   (SELECT string_agg(format('%s AS k%s', x.keys[k], k), ', ' ORDER BY k) FROM generate_series(1, n) AS k),
                   var, cow._rowsrc(names, 'NEW'))
         || format(E'    IF %s.p IS TRUE%s THEN\n', var,
                   CASE WHEN x.nnd AND NOT x.excl THEN ''
                        ELSE (SELECT string_agg(format(' AND %s.k%s IS NOT NULL', var, k), '' ORDER BY k)
                              FROM generate_series(1, n) AS k) END);
    IF x.excl THEN
        -- The detail names the existing key too.
        code := code || format(
            E'        SELECT _y.d INTO _cow_c FROM (SELECT %1$s AS d FROM %2$s UNION ALL SELECT %1$s AS d FROM %3$s) AS _y LIMIT 1;\n'
             '        IF FOUND THEN\n            %4$s\n        END IF;\n',
            format('concat_ws('', '', %s)', (SELECT string_agg(format('coalesce((%s)::text, ''null'')', x.keys[k]), ', ' ORDER BY k)
                                             FROM generate_series(1, n) AS k)),
            base_src, sess_src,
            cow._raise('23P01', format('conflicting key value violates exclusion constraint "%s"', x.name),
                       format('format(''Key (%%s)=(%%s) conflicts with existing key (%%s)=(%%s).'', %L, concat_ws('', '', %s), %L, _cow_c.d)',
                              x.display, newkey, x.display),
                       sch, tab, x.name));
    ELSE
        code := code || format(E'        IF EXISTS (SELECT 1 FROM %s) OR EXISTS (SELECT 1 FROM %s) THEN\n            %s\n        END IF;\n',
            base_src, sess_src,
            cow._raise('23505', format('duplicate key value violates unique constraint "%s"', x.name),
                       format('format(''Key (%%s)=(%%s) already exists.'', %L, concat_ws('', '', %s))', x.display, newkey),
                       sch, tab, x.name));
    END IF;
    code := code || E'    END IF;\n';
    IF p_upd THEN
        -- (An index that reads no column at all: check every UPDATE.)
        code := format(E'    IF %s THEN\n%s    END IF;\n', cow._changed(coalesce(nullif(x.cols, '{}'), names)), code);
    END IF;
    RETURN code;
END $gen$;

-- The trigger generator below is also the cheaper in-session write path (measured in docs/layer.md
-- "Performance" and docs/benchmarks.md "Writes in a session"):
-- - the session id is read directly and the once-per-transaction registry check runs inline (cow._write_session
--   only for a new, closed or stale session), instead of a plpgsql call per write;
-- - PRIMARY KEY/UNIQUE checks query the changes table and the base table directly, not the overlay view;
-- - an INSERT's primary-key check looks up the key's current version once, and the INSERT retires a previous
--   version (a tombstone) only when that lookup found one;
-- - an UPDATE runs the UNIQUE and referenced-key (RESTRICT/NO ACTION) queries only when those columns change.

-- The generator of 0001 with these changes: the UNIQUE loop also emits the checks of partial and expression
-- UNIQUE indexes and exclusion constraints (cow._xcheck_code), the changes table gets their lookup indexes, and
-- the write path above.
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
    decl text := E'DECLARE\n    _s text := nullif(pg_catalog.current_setting(''cow.session_id'', true), '''');\n    _st text;\n    _lw timestamptz;\n    _o text;\n    _base jsonb;\n    _seen boolean;\n    _bad text;\n    _pfk int;\n    _pseq bigint;\n    _porig jsonb;\n    _morig jsonb;\n    _pdel boolean;\n';
    fk_all text := '0';     -- every FOREIGN KEY bit (an INSERT checks them all)
    fk_changed text := '0'; -- the bits of the FOREIGN KEYs whose columns an UPDATE changed
    fk_n int := 0;
    mark_guc text;
    dflt_ins text := '';
    dflt_upd text := '';
    xn int := 0;          -- checks generated by cow._xcheck_code
    pk_probe boolean := false;  -- the INSERT's primary-key check looked up the key's current version (_pdel)
    rec text;
    -- Once per transaction (cow._write_session's stamp): the registry row is read here, and only a new, closed
    -- or stale (last_write_at older than a second) session or an operation id that was not validated calls
    -- cow._write_session, which registers, refuses or updates. A plpgsql call per write cost ~20 us.
    reg_code text := E'    IF _s IS NOT NULL AND pg_catalog.current_setting(''cow._registered'', true) IS DISTINCT FROM _s || ''/'' || pg_catalog.pg_current_xact_id()::text THEN\n'
                      '        SELECT x.status, x.last_write_at INTO _st, _lw FROM cow.sessions x WHERE x.session_id = _s;\n'
                      '        IF _st = ''open'' AND _lw >= pg_catalog.now() - interval ''1 second'' AND coalesce(pg_catalog.current_setting(''cow.operation_id'', true), '''') ~ ''^([A-Za-z0-9._:-]{1,128})?$'' THEN\n'
                      '            PERFORM pg_catalog.set_config(''cow._registered'', _s || ''/'' || pg_catalog.pg_current_xact_id()::text, true);\n'
                      '        ELSE\n'
                      '            PERFORM cow._write_session();\n'
                      '        END IF;\n'
                      '    END IF;\n';
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    PERFORM cow._build_lookup_indexes(p_id);
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
    -- PRIMARY KEY and UNIQUE (23505), and exclusion constraints (23P01), against the session's view of the
    -- table, in index creation order like PostgreSQL. Partial and expression UNIQUE indexes and exclusion
    -- constraints: cow._xcheck_code.
    FOR con IN SELECT x.indexrelid AS idx, ic.relname AS name, cow._attnames(rel, x.indkey::int2[]) AS cols,
                      x.indnullsnotdistinct AS nnd, x.indisprimary AS prim,
                      x.indisunique AND NOT x.indisexclusion AND x.indpred IS NULL AND x.indexprs IS NULL AS plain
               FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
               WHERE x.indrelid = rel AND (x.indisunique OR x.indisexclusion)
               ORDER BY x.indexrelid LOOP
        IF NOT con.plain THEN
            xn := xn + 1;
            decl := decl || format(E'    _cow_k%s record;\n', xn) || CASE WHEN xn = 1 THEN E'    _cow_c record;\n' ELSE '' END;
            uq_ins := uq_ins || cow._xcheck_code(rel, con.idx, false, '_cow_k' || xn, b, ch, names, pk, sch, tab);
            uq_upd := uq_upd || cow._xcheck_code(rel, con.idx, true, '_cow_k' || xn, b, ch, names, pk, sch, tab);
            CONTINUE;
        END IF;
        keytxt := format('format(''Key (%%s)=(%%s) already exists.'', %L, %s)',
                         cow._collist(con.cols), cow._keytext(con.cols, 'NEW'));
        IF con.nnd THEN
            cond := (SELECT string_agg(format('z.%I IS NOT DISTINCT FROM NEW.%I', c, c), ' AND ')
                     FROM unnest(con.cols) AS c);
        ELSE
            cond := cow._eq(con.cols, 'z', 'NEW');
        END IF;
        -- The session's view of the table spelled out: its current versions (the changes table's index for
        -- this constraint), then base rows it holds no version of (a per-row probe, `OFFSET 0`). Through the
        -- overlay view every check initialised the plan of all three branches (~25 us per write).
        IF con.prim AND con.cols = pk AND NOT con.nnd THEN
            -- The primary key of an INSERT: one lookup of the session's current version of the key tells both
            -- the conflict and whether there is a version (a tombstone) to retire, so an INSERT of a key the
            -- session never wrote skips the retiring UPDATE (~10 us).
            pk_probe := true;
            uq_ins := uq_ins || format(E'    SELECT c._cow_deleted INTO _pdel FROM %s c WHERE c._cow_session = _s AND c._cow_current AND %s;\n'
                                        '    IF _pdel IS FALSE OR (_pdel IS NULL AND EXISTS (SELECT 1 FROM %s z WHERE %s)) THEN\n        %s\n    END IF;\n',
                ch, cow._eq(pk, 'c', 'NEW'), b, cond,
                cow._raise('23505', format('duplicate key value violates unique constraint "%s"', con.name), keytxt,
                           sch, tab, con.name));
        ELSE
        uq_ins := uq_ins || format(E'    IF %s(%s) THEN\n        %s\n    END IF;\n',
            CASE WHEN con.nnd THEN '' ELSE cow._notnull(con.cols, 'NEW') || ' AND ' END,
            format('EXISTS (SELECT 1 FROM %1$s z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND %2$s) '
                   'OR EXISTS (SELECT 1 FROM %3$s z WHERE %2$s AND NOT EXISTS (SELECT 1 FROM %1$s c WHERE c._cow_session = _s AND c._cow_current AND %4$s OFFSET 0))',
                   ch, cond, b, cow._eq(pk, 'c', 'z')),
            cow._raise('23505', format('duplicate key value violates unique constraint "%s"', con.name), keytxt,
                       sch, tab, con.name));
        END IF;
        -- An UPDATE that leaves the key alone cannot create a duplicate; the nested IF keeps the query (and its
        -- executor start-up) off that path.
        uq_upd := uq_upd || format(E'    IF %s THEN\n        IF %s(%s) THEN\n            %s\n        END IF;\n    END IF;\n',
            cow._changed(con.cols), CASE WHEN con.nnd THEN '' ELSE cow._notnull(con.cols, 'NEW') || ' AND ' END,
            format('EXISTS (SELECT 1 FROM %1$s z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND %2$s AND NOT (%5$s)) '
                   'OR EXISTS (SELECT 1 FROM %3$s z WHERE %2$s AND NOT (%5$s) AND NOT EXISTS (SELECT 1 FROM %1$s c WHERE c._cow_session = _s AND c._cow_current AND %4$s OFFSET 0))',
                   ch, cond, b, cow._eq(pk, 'c', 'z'), cow._eq(pk, 'z', 'OLD')),
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
            -- (Nested: the EXISTS query runs only when the referenced key changes.)
            par_upd_check := par_upd_check || format(E'    IF %s%s THEN\n        IF %s THEN\n            %s\n        END IF;\n    END IF;\n',
                                                     cow._changed(con.refcols),
                                                     CASE WHEN con.confupdtype = 'a' AND con.child_cow
                                                          THEN format(' AND NOT %s', cow._changed(pk)) ELSE '' END,
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
    rec := cow._rec_code(ch, b, names, pk, 'NEW', false, fk_all, mark_guc, 'NULL');
    IF pk_probe THEN
        -- (_rec_code: retire the current version, then insert the new one; the retire only after a tombstone.)
        rec := format(E'    IF _pdel IS NOT NULL THEN\n%s    END IF;\n%s',
                      substr(rec, 1, strpos(rec, E'\n    INSERT INTO ')), substr(rec, strpos(rec, E'\n    INSERT INTO ') + 1));
    END IF;
    fn := format('cow_changes.%I', r.changes_table || '_ins');
    EXECUTE format(E'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                   'AS $body$\n%sBEGIN\n%s%s'
                   '    IF _s IS NULL THEN\n        INSERT INTO %s AS y (%s) %s VALUES (%s) RETURNING y.* INTO NEW;\n        RETURN NEW;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s%s%s%s    RETURN NEW;\nEND $body$',
                   fn, decl, reg_code, dflt_ins, b, cow._collist(ncols), CASE WHEN has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END,
                   cow._collist(ncols, 'NEW.'), gen_code, nn_code, chk_code, uq_ins, '',
                   rec);
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_insert INSTEAD OF INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()', v, fn);
    -- UPDATE: a primary-key change is a delete of the old key and a write of the new one.
    fn := format('cow_changes.%I', r.changes_table || '_upd');
    EXECUTE format(E'CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql '
                   'AS $body$\n%sBEGIN\n%s%s'
                   '    IF _s IS NULL THEN\n        UPDATE %s AS y SET (%s) = ROW(%s) WHERE %s RETURNING y.* INTO NEW;\n        RETURN NEW;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s%s%s%s'
                   '    IF %s THEN\n%s    END IF;\n%s%s    RETURN NEW;\nEND $body$',
                   fn, decl, reg_code, dflt_upd, b, cow._collist(setcols), cow._collist(setcols, 'NEW.'), cow._eq(pk, 'y', 'OLD'),
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
                   'AS $body$\n%sBEGIN\n%s'
                   '    IF _s IS NULL THEN\n        DELETE FROM %s AS y WHERE %s;\n        IF NOT FOUND THEN\n            RETURN NULL;\n        END IF;\n        RETURN OLD;\n    END IF;\n'
                   '    _o := cow._write_operation();\n%s%s%s    RETURN OLD;\nEND $body$',
                   fn, decl, reg_code, b, cow._eq(pk, 'y', 'OLD'), par_del_check,
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
