-- cowproxy copy-on-write layer: the helpers of the in-session checks of partial and expression UNIQUE indexes and
-- exclusion constraints (23505 / 23P01), against base + session with indexed lookups, and the changes tables'
-- mirrors of the base tables' indexes those lookups (and a session's reads) use.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- Whether the changes table mirrors base index x with a lookup index: all but the primary key and the plain
-- UNIQUE ones (cow._build_view mirrors those), see cow._xindexes. (A table's key index, cow._key_index, is one
-- of these two: a unique index that stands in for a missing primary key is plain.)
CREATE OR REPLACE FUNCTION cow._mirrored(x pg_catalog.pg_index) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT x.indisexclusion OR NOT (x.indisprimary OR (x.indisunique AND x.indpred IS NULL AND x.indexprs IS NULL))
$$;

-- The indexes of table p_rel that the changes table mirrors with a lookup index (all but the primary key and
-- the plain UNIQUE ones, which cow._build_view mirrors), in index creation order: the UNIQUE indexes that are
-- partial or have expressions and the indexes of exclusion constraints (PostgreSQL checks a row against them
-- in that order; a generated check needs what is here), and the non-unique indexes (so that a read in a
-- session finds the session's rows by the same keys as the base rows), as SQL text that names columns bare.
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
    WHERE x.indrelid = p_rel AND cow._mirrored(x)
    ORDER BY x.indexrelid
$$;

-- Lookup indexes on the changes table for those indexes (name prefix `<t>_xq`, apart from _build_view's `<t>_u`
-- ones): the same keys (expressions, collations, opclasses) and predicate over the changes table's columns,
-- restricted to current, not deleted versions, so a check or a read probes an index on both sides of the
-- overlay view. (Without one, a join on an indexed column read all of the session's versions per outer row,
-- and a plan over a session with many changes was costed high enough to start parallel workers.)
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
    -- (Most tables have no such index: skip cow._xindexes, whose query costs ~1.5 ms to plan.)
    FOR x IN SELECT * FROM cow._xindexes(r.relid)
             WHERE EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = r.relid AND cow._mirrored(i)) LOOP
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
    -- (The changes table's own indexes, through pg_index's index: a LIKE on a name that is a variable cannot
    -- use pg_class's, and scanning all of pg_class for each table made install quadratic.)
    FOR x IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = to_regclass(format('cow_changes.%I', r.changes_table))
               AND c.relname LIKE r.changes_table || '\_xq%' AND NOT c.relname = ANY (wanted) LOOP
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
