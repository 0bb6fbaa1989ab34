-- cowproxy copy-on-write layer: the generators of the per-table objects.
-- A repeatable file (docs/layer.md, "Migrations"): it holds the one current definition of each function in it,
-- and `install` re-applies it whenever its text changes, after the numbered files and before cow.refresh(true).

-- ---------------------------------------------------------------------------------------------------------
-- Per-table objects: the changes table, the overlay view, the INSTEAD OF triggers
-- ---------------------------------------------------------------------------------------------------------

-- The columns of base table rel, in attribute order: names, types as the changes table declares them (with a
-- collation other than the type's), attribute numbers. Shared by both generators (keyed, keyless).
-- (plpgsql: a SQL function planned its query at each call.)
CREATE OR REPLACE FUNCTION cow._base_columns(rel oid, OUT names text[], OUT types text[], OUT nums int[])
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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
END $$;

-- Column p_col of changes table p_ch after app DDL added it to (p_added) or retyped it in base table p_b (key
-- p_pk, NULL for a keyless table): the session's versions of base rows take the value the base row has now, as
-- their snapshots do (the only value the DDL could have given that row); the session's own rows an added
-- column's default, identity or generation expression, as the plain table's rows got at ALTER TABLE. A keyless
-- table's rows have no base row to match: each takes the expression, and its own value is its snapshot.
CREATE OR REPLACE FUNCTION cow._rebase_column(p_ch text, p_b text, p_pk text[], p_col text, p_added boolean)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    a record;
    expr text;
BEGIN
    SELECT att.attgenerated = 's' AS generated, att.attidentity <> '' AS identity, pg_get_expr(d.adbin, d.adrelid) AS def
    INTO a FROM pg_attribute att LEFT JOIN pg_attrdef d ON d.adrelid = att.attrelid AND d.adnum = att.attnum
    WHERE att.attrelid = p_b::regclass AND att.attname = p_col;
    expr := CASE WHEN a.identity THEN format('nextval(%L::regclass)', pg_get_serial_sequence(p_b, p_col)) ELSE a.def END;
    IF p_pk IS NOT NULL THEN
        EXECUTE format('UPDATE %s c SET _cow_base = CASE WHEN c._cow_base IS NULL THEN NULL '
                       'ELSE c._cow_base || jsonb_build_object(%L, to_jsonb(b.%I)) END%s FROM %s b WHERE %s',
                       p_ch, p_col, p_col,
                       CASE WHEN p_added AND NOT a.generated THEN format(', %I = b.%I', p_col, p_col) ELSE '' END,
                       p_b, cow._eq(p_pk, 'c', 'b'));
    END IF;
    IF p_added AND expr IS NOT NULL THEN
        -- A generated column follows each version's own values; a default only the rows no base row gave one.
        EXECUTE format('UPDATE %s c SET %I = %s%s', p_ch, p_col, expr,
                       CASE WHEN a.generated OR p_pk IS NULL THEN ''
                            ELSE format(' WHERE NOT EXISTS (SELECT 1 FROM %s b WHERE %s)', p_b, cow._eq(p_pk, 'c', 'b')) END);
    END IF;
    IF p_pk IS NULL THEN
        EXECUTE format('UPDATE %s c SET _cow_base = c._cow_base || jsonb_build_object(%L, to_jsonb(c.%I)) '
                       'WHERE c._cow_base IS NOT NULL', p_ch, p_col, p_col);
    END IF;
END $gen$;

-- Create the changes table of registry entry r, or bring it in step with the base table's columns (names,
-- types, attribute numbers now; r holds those it was made for). Shared by both generators (keyed, keyless).
CREATE OR REPLACE FUNCTION cow._changes_table(r cow.registry, names text[], types text[], nums int[]) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    ch text := format('cow_changes.%I', r.changes_table);
    k int;
    i int;
    b text := r.relid::regclass::text;
    pk text[] := nullif(cow._pk_columns(r.relid), '{}');
    col record;
BEGIN
    IF to_regclass(ch) IS NULL THEN
        EXECUTE format('CREATE TABLE %s (_cow_seq bigint NOT NULL DEFAULT nextval(''cow.write_seq''), '
                       '_cow_session text NOT NULL, _cow_op text NOT NULL, _cow_deleted boolean NOT NULL, '
                       '_cow_current boolean NOT NULL DEFAULT true, _cow_base jsonb, _cow_fk int NOT NULL DEFAULT 0, '
                       '_cow_origin jsonb%s) WITH (autovacuum_vacuum_scale_factor = 0.01, '
                       'autovacuum_vacuum_insert_scale_factor = 0.01)',
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
            -- The base snapshots (_cow_base, what commit compares the base row with) follow too; else every
            -- row a session changed before the DDL would be a conflict (40001) at commit.
            IF k IS NULL THEN
                EXECUTE format('ALTER TABLE %s DROP COLUMN IF EXISTS %I', ch, r.col_names[i]);
                EXECUTE format('UPDATE %s SET _cow_base = _cow_base - %L WHERE _cow_base ? %L', ch,
                               r.col_names[i], r.col_names[i]);
            ELSE
                IF names[k] <> r.col_names[i] THEN
                    EXECUTE format('ALTER TABLE %s RENAME COLUMN %I TO %I', ch, r.col_names[i], names[k]);
                    EXECUTE format('UPDATE %s SET _cow_base = (_cow_base - %L) || jsonb_build_object(%L, _cow_base -> %L) '
                                   'WHERE _cow_base ? %L', ch, r.col_names[i], names[k], r.col_names[i], r.col_names[i]);
                END IF;
                IF types[k] <> r.col_types[i] THEN
                    EXECUTE format('ALTER TABLE %s ALTER COLUMN %I TYPE %s USING %I::%s', ch, names[k], types[k],
                                   names[k], split_part(types[k], ' COLLATE ', 1));
                    PERFORM cow._rebase_column(ch, b, pk, names[k], false);
                END IF;
            END IF;
        END LOOP;
        FOR k IN 1 .. array_length(nums, 1) LOOP
            IF NOT nums[k] = ANY (r.col_attnums) THEN
                EXECUTE format('ALTER TABLE %s ADD COLUMN %I %s', ch, names[k], types[k]);
                PERFORM cow._rebase_column(ch, b, pk, names[k], true);
            END IF;
        END LOOP;
    END IF;
    -- (A new changes table has them from its CREATE TABLE: one statement less per table.)
    -- Autovacuum after ~1 % of the table changed instead of 20 %: a session's reads probe its current versions
    -- with index-only scans of <t>_cur, which read the heap for every page not marked all-visible and walk
    -- the index entries of retired versions until a vacuum removes them (bench/layer.py --stale-session: a
    -- 100-row range read in a session 3.1x the plain table before a vacuum, 2.1x after; docs/layer.md).
    IF NOT coalesce((SELECT c.reloptions @> ARRAY['autovacuum_vacuum_scale_factor=0.01',
                                                  'autovacuum_vacuum_insert_scale_factor=0.01']
                     FROM pg_class c WHERE c.oid = to_regclass(ch)), false) THEN
        EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0.01, '
                       'autovacuum_vacuum_insert_scale_factor = 0.01)', ch);
    END IF;
    -- Every role may read and write the changes table (the generated triggers run as the writing role), but
    -- only the rows of its connection's session (cow._session(): the bound one on a bound backend): SQL that
    -- reaches the table by name cannot read or forge another session's changes. The layer's owner (the
    -- views, commit, diff) and superusers are not subject to it. (SELECT ...): once per statement.
    IF NOT EXISTS (SELECT 1 FROM pg_policy p WHERE p.polrelid = to_regclass(ch) AND p.polname = 'cow_own_session') THEN
        EXECUTE format('CREATE POLICY cow_own_session ON %s USING (_cow_session = (SELECT cow._session())) '
                       'WITH CHECK (_cow_session = (SELECT cow._session()))', ch);
    END IF;
    IF NOT (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = to_regclass(ch)) THEN
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', ch);
    END IF;
END $gen$;

-- The overlay view v's column defaults and privileges, from base table p_rel (b: its quoted name; p_changes:
-- the changes table, which names the DEFAULT flags). Shared by both generators (keyed, keyless).
CREATE OR REPLACE FUNCTION cow._view_defaults(rel oid, v text, b text, p_changes text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    col record;
BEGIN
    -- Defaults come from the base table (serial and identity values from its sequences).
    FOR col IN SELECT a.attname, a.attnum, pg_get_expr(d.adbin, d.adrelid) AS def, a.attidentity, a.attgenerated,
                      format_type(a.atttypid, a.atttypmod) AS typ
               FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped LOOP
        IF col.attidentity = 'a' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT cow._defaulted(nextval(%L::regclass), %L)', v,
                           col.attname, pg_get_serial_sequence(b, col.attname),
                           'cow._d_' || p_changes || '_' || col.attnum);
        ELSIF col.attgenerated <> '' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT cow._defaulted(NULL::%s, %L)', v, col.attname,
                           col.typ, 'cow._d_' || p_changes || '_' || col.attnum);
        ELSIF col.attidentity = 'd' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT nextval(%L::regclass)', v, col.attname,
                           pg_get_serial_sequence(b, col.attname));
        ELSIF col.def IS NOT NULL AND col.attgenerated = '' THEN
            EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT %s', v, col.attname, col.def);
        END IF;
    END LOOP;
    -- The view's privileges mirror the table's (the owner of the table gets them all): one GRANT per grantee,
    -- in the order of the table's ACL (the same ACL as a GRANT per privilege, in a quarter of the statements).
    FOR col IN SELECT q.who, string_agg(q.priv, ', ' ORDER BY q.n) AS privs
               FROM (SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS who,
                            a.privilege_type AS priv, a.n
                     FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) WITH ORDINALITY AS a(grantor, grantee, privilege_type, is_grantable, n)
                     WHERE c.oid = rel AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')) q
               GROUP BY q.who ORDER BY min(q.n) LOOP
        EXECUTE format('GRANT %s ON %s TO %s', col.privs, v, col.who);
    END LOOP;
END $gen$;

-- Create or bring in step the changes table of registry entry p_id, then (re)create its overlay view. The
-- changes tables are autovacuumed after ~1 % changed (docs/layer.md, "Performance").
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
    -- The session GUC as is: NULL (never set) or '' without a session. No changes row has either as its
    -- _cow_session (ids are validated when written), so the view needs no nullif(): a smaller expression,
    -- planned five times per read (docs/layer.md, "Overlay view shape").
    sess text := $$pg_catalog.current_setting('cow.session_id', true)$$;
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
    SELECT c.names, c.types, c.nums INTO names, types, nums FROM cow._base_columns(rel) c;
    pk := cow._pk_columns(rel);

    PERFORM cow._changes_table(r, names, types, nums);
    -- The current version of each (session, key): what the overlay view merges.
    IF pk IS DISTINCT FROM r.pk_columns OR to_regclass(format('cow_changes.%I', r.changes_table || '_cur')) IS NULL THEN
        EXECUTE format('DROP INDEX IF EXISTS cow_changes.%I', r.changes_table || '_cur');
        EXECUTE format('CREATE UNIQUE INDEX %I ON %s (_cow_session, %s) WHERE _cow_current', r.changes_table || '_cur',
                       ch, cow._collist(pk));
    END IF;
    -- Lookups for the session's UNIQUE checks.
    -- (Found through pg_index's index, as in cow._build_lookup_indexes.)
    FOR idx IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = to_regclass(ch) AND c.relname LIKE r.changes_table || '\_u%' LOOP
        EXECUTE format('DROP INDEX cow_changes.%I', idx.relname);
    END LOOP;
    -- (Not for the key index, the primary key or the unique index that stands in for it: <t>_cur is its.)
    FOR idx IN SELECT cow._attnames(rel, (x.indkey::int2[])[0:x.indnkeyatts - 1]) AS cols FROM pg_index x
               WHERE x.indrelid = rel AND x.indisunique AND x.indexrelid IS DISTINCT FROM cow._key_index(rel)
                 AND x.indpred IS NULL AND x.indexprs IS NULL ORDER BY x.indexrelid LOOP
        n := n + 1;
        EXECUTE format('CREATE INDEX %I ON %s (_cow_session, %s) WHERE _cow_current AND NOT _cow_deleted',
                       r.changes_table || '_u' || n, ch, cow._collist(idx.cols));
    END LOOP;

    v := format('%I.%I', r.overlay_schema, tab);
    -- One UNION ALL of two leaves without quals, the base table and the changes table, tagged by a constant
    -- _cow_k: PostgreSQL pulls such a UNION ALL up into an append relation of the two tables (a leaf with a
    -- WHERE would stay a subquery, and then no index path of the base table, parameterized or ordered,
    -- reaches a join or an ORDER BY ... LIMIT above the view; docs/layer.md, "Overlay view shape"). The
    -- leaves' column types and collations are the same (the changes table is made from the base's), which
    -- the pull-up needs. The outer conditions fold per leaf: base rows pass, the changes leaf keeps the
    -- session's current, not deleted versions (a one-time filter without a session). The anti join drops
    -- the base rows this session has a version of; it is over the append, with the base leaf's key. It has
    -- no condition on the session being set: without one its key is NULL or '', which no row has.
    -- The changes leaf is kept out of it by _cow_b (true in the base leaf, NULL in the changes leaf) as a
    -- join key, not by a filter on _cow_k: PostgreSQL 16+ costs a join filter for every row a Hash Anti
    -- Join returns but a Hash Right Anti Join's only for matched rows, so with the filter it hashed the
    -- append and probed it with the session's keys, returning the rows in hash order (a plain table's
    -- scan, and this view on 15, return them in the order of the heap; docs/layer.md, "Row order"). Its
    -- other side is computed from a key column, so x stays an index-only scan of <t>_cur.
    -- _cow_s = coalesce(<session>, '') is a top-level equality with a constant (true in the base leaf, where
    -- _cow_s is that constant): it puts the changes leaf's _cow_session in an equivalence class with a
    -- constant, so <t>_cur (_cow_session, pk) counts as ordered by the primary key and a Merge Append needs
    -- no sort of the session's rows (PostgreSQL 15 costs that sort by the whole changes table's row count).
    EXECUTE cow._fill($t$CREATE VIEW {{view}} AS SELECT {{columns}} FROM (
    SELECT 1 AS _cow_k, {{base_columns}}, coalesce({{session}}, '') AS _cow_s, NULL::boolean AS _cow_cur,
           NULL::boolean AS _cow_del, true AS _cow_b FROM {{base}} b
    UNION ALL SELECT 2, {{changes_columns}}, c._cow_session, c._cow_current, c._cow_deleted, NULL FROM {{changes}} c) u
WHERE {{gate}} AND u._cow_s = coalesce({{session}}, '') AND CASE u._cow_k WHEN 1 THEN true
      ELSE {{session}} <> '' AND u._cow_cur AND NOT u._cow_del END
  AND NOT EXISTS (SELECT 1 FROM {{changes}} x WHERE x._cow_session = {{session}} AND x._cow_current
                  AND ({{key_column}} IS NOT NULL) = u._cow_b AND {{has_version}})$t$,
        jsonb_build_object(
            'view', v,
            'columns', cow._collist(names, 'u.'),
            'base_columns', cow._collist(names, 'b.'),
            'base', b,
            'changes_columns', cow._collist(names, 'c.'),
            'changes', ch,
            'session', sess,
            'gate', cow._read_gate_sql(),
            'has_version', cow._eq(pk, 'x', 'u'),
            'key_column', 'x.' || quote_ident(pk[1])));
    PERFORM cow._view_defaults(rel, v, b, r.changes_table);

    UPDATE cow.registry SET table_schema = sch, table_name = tab, pk_columns = pk, col_attnums = nums,
                            col_names = names, col_types = types
    WHERE id = p_id;
END $gen$;

-- Record a write of the row in record variable `var` (NEW or OLD) in the changes table: the previous current
-- version of that key stops being current; the first write of a key in the session snapshots the base row
-- (commit compares it to detect conflicts; diff shows it as the old row). `snap` says where that snapshot
-- comes from when the session holds no current version of the key (_seen IS NULL after the retiring UPDATE):
-- NULL: a query of the base table; 'NULL': none (an INSERT whose primary-key check found no base row);
-- otherwise a condition under which OLD is the base row ('true': always), else the query.
-- Why OLD: an UPDATE or DELETE through the overlay view got OLD from the view's base leaf whenever the session
-- held no version of its key (a version, once written, stays current until the next version of the key
-- replaces it), so OLD is the base row as of the statement's snapshot: the row the session's change was
-- computed from. The query would read a newer snapshot in READ COMMITTED and miss a base change committed
-- meanwhile, which commit's conflict check (40001) must see. And it costs a query.
-- The snapshot is assigned to _base in plpgsql, not computed in the INSERT: an INSERT whose base value is a
-- CASE over _seen with a sub-select gets cheaper custom plans when _seen is true (the CASE folds), so the
-- plan cache could keep planning it at every write (+10-20 us, bench of docs/benchmarks.md).
--
-- Two transactions of one session writing one row at the same time (a web request and a background job routed
-- to the same session): on the plain table the second waits on the first's row lock, then works on the new row
-- version. Here the second waits too (on the first's lock of the version it retires, or on <t>_cur when the
-- first inserted the key's current version), but an INSTEAD OF trigger cannot re-run the statement's SET list
-- on the new version; the second then failed with 23505 on <t>_cur or silently overwrote the first writer's
-- change with values computed from the row it had read. Now an UPDATE or DELETE passes `stale`
-- (cow._unchanged_since the row the statement read, OLD): the retire skips a current version that another,
-- committed transaction wrote and that differs from that row (or is a tombstone); and `conflict`: the version
-- goes in `ON CONFLICT DO NOTHING` on <t>_cur, and when a current version is still there `conflict` runs:
-- 40001 (as the plain table does in REPEATABLE READ; a retry reads the new version), or the table's 23505 for
-- a key an UPDATE moves to. Versions of the writer's own transaction (a cascade that wrote the row earlier in
-- the same statement) are in progress, so they are retired as before.
-- (The signatures of earlier versions are dropped by migration 0010: a call that fits two overloads is ambiguous.)
CREATE OR REPLACE FUNCTION cow._rec_code(ch text, b text, names text[], pk text[], var text, deleted boolean,
                                         fkmask text DEFAULT '0', mark_guc text DEFAULT NULL,
                                         origin text DEFAULT NULL, snap text DEFAULT NULL,
                                         stale text DEFAULT NULL, conflict text DEFAULT NULL)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT cow._fill($c$
    _seen := NULL;
    UPDATE {{changes}} x SET _cow_current = false WHERE x._cow_session = _s AND x._cow_current AND {{current}}
        RETURNING x._cow_base, true, x._cow_fk, x._cow_seq, x._cow_origin INTO _base, _seen, _pfk, _pseq, _porig;
{{snapshot}}    INSERT INTO {{changes}} (_cow_session, _cow_op, _cow_deleted, _cow_base, _cow_fk, _cow_origin, {{columns}})
    VALUES (_s, _o, {{deleted}}, _base, {{fk_bits}}, {{origin}}, {{values}}){{on_conflict}};
$c$, jsonb_build_object(
       'changes', ch,
       'current', cow._eq(pk, 'x', var) || CASE WHEN stale IS NULL THEN '' ELSE ' AND ' || stale END,
       'columns', cow._collist(names),
       'deleted', CASE WHEN deleted THEN 'true' ELSE 'false' END,
       'values', cow._collist(names, var || '.'),
       -- FOREIGN KEYs to check at the end of the statement: those this write changed, plus those an earlier
       -- write of the same row in the same (outermost) statement changed.
       'fk_bits', CASE WHEN deleted OR mark_guc IS NULL THEN '0'
            ELSE format($m$(%s) | CASE WHEN _pseq > coalesce(nullif(pg_catalog.split_part(pg_catalog.current_setting(%L, true), ',', 1), '')::bigint, 9223372036854775807) THEN coalesce(_pfk, 0) ELSE 0 END$m$,
                        fkmask, mark_guc) END,
       -- The base key the row descends from: kept from the previous version, or the key itself when this is
       -- the session's first write of a row read from the base; an INSERT passes NULL.
       'origin', coalesce(origin, format('CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END',
                                         cow._jsonargs(pk, var))),
       -- (No version: the UPDATE ... INTO found no row and left _base NULL.)
       'snapshot', CASE WHEN snap = 'NULL' THEN ''
            WHEN snap = 'true' THEN E'    IF _seen IS NULL THEN\n        _base := pg_catalog.to_jsonb(OLD);\n    END IF;\n'
            WHEN snap IS NULL THEN format(E'    IF _seen IS NULL THEN\n        _base := (SELECT pg_catalog.to_jsonb(y.*) FROM %s y WHERE %s);\n    END IF;\n',
                                          b, cow._eq(pk, 'y', var))
            ELSE format(E'    IF _seen IS NULL THEN\n        IF %s THEN\n            _base := pg_catalog.to_jsonb(OLD);\n'
                         '        ELSE\n            _base := (SELECT pg_catalog.to_jsonb(y.*) FROM %s y WHERE %s);\n        END IF;\n    END IF;\n',
                        snap, b, cow._eq(pk, 'y', var)) END,
       -- (Without `conflict`, a plain INSERT: the speculative one costs ~10 us, and an INSERT's key check ran
       -- before, so a key that a concurrent transaction of the session inserted is 23505 on <t>_cur.)
       'on_conflict', CASE WHEN conflict IS NULL THEN ''
            ELSE format(E'\n    ON CONFLICT (_cow_session, %s) WHERE _cow_current DO NOTHING;\n'
                         '    IF NOT FOUND THEN\n        %s\n    END IF', cow._collist(pk), conflict) END))
$$;

-- The full transaction id (xid8) of a recent xid such as a row's xmin: the epoch of the current snapshot's xmax.
CREATE OR REPLACE FUNCTION cow._xid8(p_xid xid) RETURNS xid8
LANGUAGE sql STABLE AS $$
    SELECT (CASE WHEN f >= m THEN f - 4294967296 ELSE f END)::text::xid8
    FROM (SELECT m - m % 4294967296 + p_xid::text::bigint AS f, m
          FROM (SELECT pg_catalog.pg_snapshot_xmax(pg_catalog.pg_current_snapshot())::text::bigint AS m) AS s) AS t
$$;

-- The condition on the current version `x` of a key under which the row `var` a statement read is still what
-- the session holds: the same values and not deleted, or written by a transaction that has not committed (the
-- writer's own: the statement's snapshot cannot have missed it). Columns compare with IS NOT DISTINCT FROM, or
-- as text where their type has no equality (json, point, ...): text forms of every column cost ~115 us more per
-- UPDATE of a row with a 22 kB jsonb document (jsonb_out), equality ~17 us.
-- (plpgsql: cow._kl_type_ok comes with 35_keyless.sql, after this file.)
CREATE OR REPLACE FUNCTION cow._unchanged_since(rel oid, names text[], var text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN (SELECT format('((NOT x._cow_deleted AND %s)'
                          ' OR pg_catalog.pg_xact_status(cow._xid8(x.xmin)) IS DISTINCT FROM ''committed'')',
                          string_agg(CASE WHEN cow._kl_type_ok(a.atttypid)
                                          THEN format('x.%1$I IS NOT DISTINCT FROM %2$s.%1$I', a.attname, var)
                                          ELSE format('x.%1$I::text IS NOT DISTINCT FROM %2$s.%1$I::text',
                                                      a.attname, var) END,
                                     ' AND ' ORDER BY k.ord))
            FROM unnest(names) WITH ORDINALITY AS k(name, ord)
            JOIN pg_attribute a ON a.attrelid = rel AND a.attname = k.name AND NOT a.attisdropped);
END $$;

-- Deferrable constraints in a session. PostgreSQL checks a DEFERRABLE UNIQUE/EXCLUDE constraint or FOREIGN
-- KEY at the end of the statement (INITIALLY IMMEDIATE) or at COMMIT (INITIALLY DEFERRED), and `SET
-- CONSTRAINTS` moves between the two. The generated write path leaves such a constraint out of its immediate
-- checks; instead a constraint trigger on the changes table, with the constraint's name and deferrability,
-- queues an event for each new row version it must check (`WHEN`: not a tombstone for UNIQUE/EXCLUDE, the
-- FOREIGN KEY's bit for a child row, a tombstone for a referenced row), so PostgreSQL's own trigger queue
-- decides when it fires and follows `SET CONSTRAINTS ALL ...`. When it fires:
-- - at COMMIT or at `SET CONSTRAINTS ... IMMEDIATE` (trigger depth 1), it checks that version if it is still
--   current (a later version queued its own event), in the session that wrote it;
-- - in IMMEDIATE mode it fires at the end of the changes table's INSERT, inside the INSTEAD OF trigger
--   (depth > 1), which is per row: it only flags the constraint (GUC `cow._dq_<changes table>`), and the
--   view's AFTER STATEMENT trigger checks the statement's versions, as PostgreSQL does at statement end.
-- The code of one check takes the versions to check as a condition on `c` (one, or those since the
-- statement's mark).

-- "Version `alias` is not a tombstone", as a condition. The column is NOT NULL, so `IS NOT TRUE` is `NOT`;
-- but PostgreSQL proves an index predicate `NOT _cow_deleted` only from `NOT _cow_deleted` itself, so with
-- p_key the lookup indexes (<t>_u<n>, <t>_xq...) cannot serve a probe by key (cow._view_exists).
CREATE OR REPLACE FUNCTION cow._live(alias text, p_key boolean) RETURNS text
LANGUAGE sql IMMUTABLE
RETURN CASE WHEN p_key THEN alias || '._cow_deleted IS NOT TRUE' ELSE 'NOT ' || alias || '._cow_deleted' END;

-- "A row `z` of the session `_s`'s view of a keyed table satisfies p_cond": a current, not deleted version in
-- changes table ch, or a base row (of b) the session holds no version of (changes table row p_probe with z's
-- key, primary key pk). Each EXISTS has `OFFSET 0`, so that the planner cannot make it a hashed subplan,
-- which reads every current version of the session (or the whole base table) for each row checked: on
-- changes tables without statistics it did, and the deferred checks of N rows cost O(N^2).
-- p_cols: the columns of z that p_cond sets equal to a value. When they hold the key, at most one current
-- version matches and <t>_cur is the index to probe: the "not deleted" test is then written so that no index
-- whose predicate is `_cow_current AND NOT _cow_deleted` (the lookup indexes <t>_u<n> and <t>_xq...) can
-- serve the probe, where a plan made on a nearly empty table took one of them by the session alone and read
-- every version of the session (cow._plan_settings).
CREATE OR REPLACE FUNCTION cow._view_exists(ch text, b text, pk text[], p_cond text, p_probe text, p_cols text[])
RETURNS text LANGUAGE sql IMMUTABLE
RETURN cow._fill('EXISTS (SELECT 1 FROM {{changes}} z WHERE z._cow_session = _s AND z._cow_current AND {{live}} AND {{cond}} OFFSET 0) '
                 'OR EXISTS (SELECT 1 FROM {{base}} z WHERE {{cond}} AND NOT EXISTS (SELECT 1 FROM {{changes}} {{probe}} '
                 'WHERE {{probe}}._cow_session = _s AND {{probe}}._cow_current AND {{same_key}} OFFSET 0) OFFSET 0)',
                 jsonb_build_object('changes', ch, 'base', b, 'cond', p_cond, 'probe', p_probe,
                                    'live', cow._live('z', p_cols @> pk),
                                    'same_key', cow._eq(pk, p_probe, 'z')));

-- "(EXISTS (...) OR EXISTS (...))": some row of the session `_s`'s view of table p_rel satisfies p_cond (which
-- names that row `z`; p_cols: the columns it sets equal to a value): its current, not deleted versions, or
-- base rows it holds no version of (a per-row probe of <t>_cur, `OFFSET 0`), each found by the tables' own
-- indexes; the base table alone for a table outside the layer. Unlike the overlay view it names the session,
-- so a constraint trigger can check at COMMIT, and its plan probes indexes instead of a hash or scan of the
-- view's branches (a deferred check through the view cost ~115 us at COMMIT on 15, ~290 on 18; ~18 this way).
CREATE OR REPLACE FUNCTION cow._sexists(p_rel oid, p_cond text, p_cols text[]) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(
        (SELECT '(' || cow._view_exists(format('cow_changes.%I', g.changes_table), p_rel::regclass::text,
                                        g.pk_columns, p_cond, 'y', p_cols) || ')'
         FROM cow.registry g WHERE g.relid = p_rel AND g.pk_columns <> '{}'),
        -- (A keyless table, 35_keyless.sql: through its overlay view, which reads the session from the GUC;
        -- the constraint triggers set it to the session that wrote the version they check.)
        (SELECT format('EXISTS (SELECT 1 FROM %I.%I z WHERE %s OFFSET 0)', g.overlay_schema, g.table_name, p_cond)
         FROM cow.registry g WHERE g.relid = p_rel),
        format('EXISTS (SELECT 1 FROM %s z WHERE %s OFFSET 0)', p_rel::regclass, p_cond))
$$;

-- One check as a branch of the generated functions: the constraint trigger's (p_stmt false: `_k` is the
-- check's number) or the statement trigger's (p_stmt true: the check was flagged in `_g`).
CREATE OR REPLACE FUNCTION cow._defer_branch(p_k int, p_check text, p_stmt boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format(E'    IF %s THEN\n%s    END IF;\n',
                  CASE WHEN p_stmt THEN format('pg_catalog.strpos(_g, '',%s,'') > 0', p_k) ELSE format('_k = %s', p_k) END,
                  p_check)
$$;

-- Add check p_k to constraint trigger p_name (one per constraint name and mode: a self-referencing FOREIGN
-- KEY checks both sides in one trigger) of the map the generator collects.
CREATE OR REPLACE FUNCTION cow._defer_trigger(p_map jsonb, p_name text, p_deferred boolean, p_when text, p_k int)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    key text := p_name;
BEGIN
    IF p_map ? key AND (p_map -> key ->> 'deferred')::boolean IS DISTINCT FROM p_deferred THEN
        key := left(p_name, 50) || '_' || p_k;  -- two constraints of one name, one deferred: two triggers
    END IF;
    RETURN p_map || jsonb_build_object(key, jsonb_build_object(
        'deferred', p_deferred,
        'when', coalesce(p_map -> key -> 'when', '[]') || to_jsonb(p_when),
        'args', coalesce(p_map -> key -> 'args', '[]') || to_jsonb(p_k::text)));
END $$;

-- The check of a deferrable UNIQUE or exclusion constraint (index p_idx of table p_rel) over the versions
-- p_versions (a condition on the changes table's row `c`: the one version a constraint trigger fired for, or
-- the statement's since its mark): a current version whose key another row of the session's view (base rows
-- it holds no version of, plus its current versions) already has. Sets _seq/_det and, for the first
-- violation, _best and the error.
CREATE OR REPLACE FUNCTION cow._defer_unique_code(p_rel oid, p_idx oid, b text, ch text, pk text[], p_versions text)
RETURNS text LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    con record;
    x record;
    n int;
    cond text;
BEGIN
    SELECT ic.relname AS name, cow._attnames(p_rel, (i.indkey::int2[])[0:i.indnkeyatts - 1]) AS cols,
           i.indnullsnotdistinct AS nnd,
           i.indisunique AND NOT i.indisexclusion AND i.indpred IS NULL AND i.indexprs IS NULL AS plain
    INTO STRICT con FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indexrelid = p_idx;
    IF con.plain THEN
        RETURN cow._fill($t$    SELECT c._cow_seq, format('Key (%s)=(%s) already exists.', {{columns|L}}, {{key}}) INTO _seq, _det
    FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}} AND c._cow_current AND c._cow_deleted IS NOT TRUE{{not_null}}
        AND (EXISTS (SELECT 1 FROM {{changes}} z WHERE z._cow_session = _s AND z._cow_current AND NOT z._cow_deleted AND {{collides}} AND NOT ({{same_row}}) OFFSET 0)
             OR EXISTS (SELECT 1 FROM {{base}} z WHERE {{collides}} AND NOT ({{same_row}}) AND NOT EXISTS (SELECT 1 FROM {{changes}} y WHERE y._cow_session = _s AND y._cow_current AND {{has_version}} OFFSET 0) OFFSET 0))
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23505'; _btab := NULL; _bsch := NULL;
    END IF;
$t$, jsonb_build_object(
            'columns', cow._collist(con.cols),
            'key', cow._keytext(con.cols, 'c'),
            'changes', ch,
            'versions', p_versions,
            'not_null', CASE WHEN con.nnd THEN '' ELSE ' AND ' || cow._notnull(con.cols, 'c') END,
            'collides', CASE WHEN con.nnd
                             THEN (SELECT string_agg(format('z.%I IS NOT DISTINCT FROM c.%I', c, c), ' AND ')
                                   FROM unnest(con.cols) AS c)
                             ELSE cow._eq(con.cols, 'z', 'c') END,
            'same_row', cow._eq(pk, 'z', 'c'),
            'base', b,
            'has_version', cow._eq(pk, 'y', 'z'),
            'constraint', con.name,
            'message', format('duplicate key value violates unique constraint "%s"', con.name)));
    END IF;
    -- An exclusion constraint (or UNIQUE WITHOUT OVERLAPS): version by version, the keys evaluated on the
    -- version (`_r`) as cow._xcheck_code does on NEW, the version's own key left out.
    SELECT * INTO STRICT x FROM cow._xindexes(p_rel) WHERE idx = p_idx;
    n := array_length(x.keys, 1);
    SELECT string_agg(format('%s %s _cow_k.k%s', x.keys[k], x.ops[k], k), ' AND ' ORDER BY k) INTO cond
    FROM generate_series(1, n) AS k;
    IF x.pred IS NOT NULL THEN
        cond := format('(%s) AND ', x.pred) || cond;
    END IF;
    RETURN cow._fill($t$    _seq := NULL;
    FOR _r IN SELECT * FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}} AND c._cow_current AND c._cow_deleted IS NOT TRUE ORDER BY c._cow_seq LOOP
        SELECT {{predicate}} AS p, {{keys}} INTO _cow_k FROM ({{row}}) AS _x;
        IF _cow_k.p IS TRUE{{keys_not_null}} THEN
            SELECT _y.d INTO _cow_c FROM (SELECT {{shown_keys}} AS d FROM {{base}} b WHERE {{conflicts}} AND NOT ({{base_is_row}})
                AND NOT EXISTS (SELECT 1 FROM {{changes}} c WHERE c._cow_session = _s AND c._cow_current AND {{base_has_version}} OFFSET 0)
                UNION ALL SELECT {{shown_keys}} AS d FROM {{changes}} c WHERE c._cow_session = _s AND c._cow_current AND NOT c._cow_deleted
                AND {{conflicts}} AND NOT ({{version_is_row}})) AS _y LIMIT 1;
            IF FOUND THEN
                _seq := _r._cow_seq;
                _det := format('Key (%s)=(%s) conflicts with existing key (%s)=(%s).', {{display|L}}, concat_ws(', ', {{row_keys}}), {{display|L}}, _cow_c.d);
                EXIT;
            END IF;
        END IF;
    END LOOP;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23P01'; _btab := NULL; _bsch := NULL;
    END IF;
$t$, jsonb_build_object(
        'changes', ch,
        'versions', p_versions,
        'predicate', coalesce('(' || x.pred || ')', 'true'),
        'keys', (SELECT string_agg(format('%s AS k%s', x.keys[k], k), ', ' ORDER BY k) FROM generate_series(1, n) AS k),
        'row', cow._rowsrc((SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
                            WHERE a.attrelid = p_rel AND a.attnum > 0 AND NOT a.attisdropped), '_r'),
        'keys_not_null', (SELECT string_agg(format(' AND _cow_k.k%s IS NOT NULL', k), '' ORDER BY k)
                          FROM generate_series(1, n) AS k),
        'shown_keys', format('concat_ws('', '', %s)',
                             (SELECT string_agg(format('coalesce((%s)::text, ''null'')', x.keys[k]), ', ' ORDER BY k)
                              FROM generate_series(1, n) AS k)),
        'base', b,
        'conflicts', cond,
        'base_is_row', cow._eq(pk, 'b', '_r'),
        'base_has_version', cow._eq(pk, 'c', 'b'),
        'version_is_row', cow._eq(pk, 'c', '_r'),
        'display', x.display,
        'row_keys', (SELECT string_agg(format('coalesce(_cow_k.k%s::text, ''null'')', k), ', ' ORDER BY k)
                     FROM generate_series(1, n) AS k),
        'constraint', x.name,
        'message', format('conflicting key value violates exclusion constraint "%s"', x.name)));
END $gen$;

-- The branches of p_checks (cow._defer_branch, p_stmt false) for checks p_ks, in their order.
CREATE OR REPLACE FUNCTION cow._defer_branches(p_checks text, p_ks text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(string_agg(x.b, '' ORDER BY x.n), '')
    FROM pg_catalog.regexp_split_to_table(p_checks, E'(?=    IF _k = \\d+ THEN\\n)') WITH ORDINALITY AS x(b, n)
    WHERE pg_catalog.substring(x.b, '^    IF _k = (\d+) THEN') = ANY (p_ks)
$$;

-- (Re)create the constraint triggers of registry entry p_id's changes table from the generator's map, each
-- with its own function `<t>_dfr<k>` (k: the trigger's first check) holding its checks of p_checks. One
-- function per trigger: PL/pgSQL compiles a trigger function once per trigger that calls it, whole, so one
-- function for all of a table's constraint triggers was compiled by each of them with every check of the
-- table (a table many FOREIGN KEYs reference has a check per referencing constraint).
CREATE OR REPLACE FUNCTION cow._defer_triggers(p_id int, p_map jsonb, p_checks text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    ch text;
    fn text;
    t record;
    f regprocedure;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    ch := format('cow_changes.%I', r.changes_table);
    FOR t IN SELECT tgname FROM pg_trigger WHERE tgrelid = ch::regclass AND NOT tgisinternal LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, ch);
    END LOOP;
    -- (Also an older layer's `<t>_dfr`, one function for all the table's constraint triggers.)
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'cow_changes'::regnamespace AND p.proname ~ ('^' || r.changes_table || '_dfr\d*$') LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
    FOR t IN SELECT key AS name, value AS spec, ARRAY(SELECT jsonb_array_elements_text(value -> 'args')) AS args
             FROM jsonb_each(p_map) LOOP
        fn := format('cow_changes.%I', r.changes_table || '_dfr' || t.args[1]);
        EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
DECLARE
    _s text := NEW._cow_session;
    _v bigint := NEW._cow_seq;
    _k int;
    _i int;
    _g text;
    _g0 text;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _r record;
    _cow_k record;
    _cow_c record;
BEGIN
    IF pg_catalog.pg_trigger_depth() > 1 THEN
        -- IMMEDIATE mode, inside a write: the statement trigger checks at the end of the statement.
        _g := coalesce(pg_catalog.current_setting({{flags|L}}, true), '');
        FOR _i IN 0 .. TG_NARGS - 1 LOOP
            IF pg_catalog.strpos(_g, ',' || TG_ARGV[_i] || ',') = 0 THEN
                _g := CASE WHEN _g = '' THEN ',' ELSE _g END || TG_ARGV[_i] || ',';
                _g := pg_catalog.set_config({{flags|L}}, _g, true);
            END IF;
        END LOOP;
        RETURN NULL;
    END IF;
    -- At COMMIT or SET CONSTRAINTS: the checks read the session that wrote the version.
    _g0 := pg_catalog.current_setting('cow.session_id', true);
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', _s, true);  -- (_g: the flags above, unused from here)
    END IF;
    FOR _i IN 0 .. TG_NARGS - 1 LOOP
        _k := TG_ARGV[_i]::int;
{{checks}}    END LOOP;
    IF _g0 IS DISTINCT FROM _s THEN
        _g := pg_catalog.set_config('cow.session_id', coalesce(_g0, ''), true);
    END IF;
    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg, DETAIL = _bdet, SCHEMA = coalesce(_bsch, {{schema|L}}), TABLE = coalesce(_btab, {{table|L}}), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $body$$t$,
            jsonb_build_object('plans', cow._plan_settings(), 'fn', fn, 'flags', 'cow._dq_' || r.changes_table,
                               'checks', cow._defer_branches(p_checks, t.args),
                               'schema', r.table_schema, 'table', r.table_name));
        EXECUTE format('CREATE CONSTRAINT TRIGGER %I AFTER INSERT ON %s DEFERRABLE INITIALLY %s FOR EACH ROW WHEN (%s) '
                       'EXECUTE FUNCTION %s(%s)',
                       t.name, ch, CASE WHEN (t.spec ->> 'deferred')::boolean THEN 'DEFERRED' ELSE 'IMMEDIATE' END,
                       (SELECT string_agg('(' || w || ')', ' OR ') FROM jsonb_array_elements_text(t.spec -> 'when') AS w),
                       fn, (SELECT string_agg(quote_literal(a), ', ') FROM unnest(t.args) AS a));
    END LOOP;
END $gen$;

-- The per-row code both generators (keyed, keyless) put in their INSERT and UPDATE triggers, in PostgreSQL's
-- order: 428C9 for an explicit value of a GENERATED ALWAYS identity or generated column (dflt_ins, dflt_upd),
-- generated columns and the partition check (gen_code), NOT NULL 23502 (nn_code), CHECK 23514 (chk_code).
CREATE OR REPLACE FUNCTION cow._row_checks(rel oid, p_changes text, names text[], ncols text[], sch text, tab text,
                                           OUT dflt_ins text, OUT dflt_upd text, OUT gen_code text, OUT nn_code text,
                                           OUT chk_code text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    col record;
    cond text;
    nn_any text := '';
BEGIN
    dflt_ins := '';
    dflt_upd := '';
    gen_code := '';
    nn_code := '';
    chk_code := '';
    -- An explicit value for a GENERATED ALWAYS identity or a generated column (no DEFAULT flag): 428C9.
    FOR col IN SELECT a.attname, a.attnum, a.attidentity = 'a' AS ident FROM pg_attribute a
               WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
                 AND (a.attidentity = 'a' OR a.attgenerated <> '') ORDER BY a.attnum LOOP
        dflt_ins := dflt_ins || format(
            E'    IF pg_catalog.current_setting(%L, true) IS DISTINCT FROM ''on'' THEN\n'
             '        RAISE EXCEPTION USING ERRCODE = ''428C9'', MESSAGE = %L, DETAIL = %L%s;\n    END IF;\n'
             '    _g := pg_catalog.set_config(%L, '''', true);\n',
            'cow._d_' || p_changes || '_' || col.attnum,
            format('cannot insert a non-DEFAULT value into column "%s"', col.attname),
            CASE WHEN col.ident THEN format('Column "%s" is an identity column defined as GENERATED ALWAYS.', col.attname)
                 ELSE format('Column "%s" is a generated column.', col.attname) END,
            CASE WHEN col.ident THEN ', HINT = ''Use OVERRIDING SYSTEM VALUE to override.''' ELSE '' END,
            'cow._d_' || p_changes || '_' || col.attnum);
        dflt_upd := dflt_upd || format(
            E'    IF NEW.%I IS DISTINCT FROM OLD.%I AND pg_catalog.current_setting(%L, true) IS DISTINCT FROM ''on'' THEN\n'
             '        RAISE EXCEPTION USING ERRCODE = ''428C9'', MESSAGE = %L, DETAIL = %L;\n    END IF;\n'
             '    _g := pg_catalog.set_config(%L, '''', true);\n',
            col.attname, col.attname, 'cow._d_' || p_changes || '_' || col.attnum,
            format('column "%s" can only be updated to DEFAULT', col.attname),
            CASE WHEN col.ident THEN format('Column "%s" is an identity column defined as GENERATED ALWAYS.', col.attname)
                 ELSE format('Column "%s" is a generated column.', col.attname) END,
            'cow._d_' || p_changes || '_' || col.attnum);
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
        nn_code := nn_code || format(E'        IF NEW.%I IS NULL THEN\n            %s\n        END IF;\n', col.attname,
            cow._raise('23502', format('null value in column "%s" of relation "%s" violates not-null constraint',
                                       col.attname, tab), NULL, sch, tab, NULL, col.attname));
        nn_any := nn_any || format(' OR NEW.%I IS NULL', col.attname);
    END LOOP;
    -- One condition on the path without a NULL (each IF is an expression evaluation, set up anew in each
    -- transaction), then the column PostgreSQL would name (the first in attribute order).
    IF nn_code <> '' THEN
        nn_code := format(E'    IF %s THEN\n%s    END IF;\n', substr(nn_any, 5), nn_code);
    END IF;
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
END $gen$;

-- The trigger generator below is also the cheaper in-session write path (measured in docs/layer.md
-- "Performance" and docs/benchmarks.md "Writes in a session"):
-- - the session id is read directly and the once-per-transaction registry check runs inline (cow._write_session
--   only for a new, closed or stale session), instead of a plpgsql call per write;
-- - PRIMARY KEY/UNIQUE checks query the changes table and the base table directly, not the overlay view;
-- - an INSERT's primary-key check looks up the key's current version once, and the INSERT retires a previous
--   version (a tombstone) only when that lookup found one;
-- - an UPDATE runs the UNIQUE and referenced-key (RESTRICT/NO ACTION) queries only when those columns change.

-- ---------------------------------------------------------------------------------------------------------
-- FOREIGN KEY checks at the end of a statement (keyed and keyless tables alike)
-- ---------------------------------------------------------------------------------------------------------
-- A check reads the versions p_versions selects (a condition on the changes table's row `c`): those the
-- statement wrote since its mark (`c._cow_seq > _mark`, the statement trigger), or the one version a constraint
-- trigger fired for (cow._defer_branch). Either way <t>_log or <t>_cur serves it; the versions that are not tombstones
-- are `c._cow_deleted IS NOT TRUE` (cow._live), so that no lookup index can, by the session alone.

-- The DETAIL of a version (row p_row: `c`, or a constraint trigger's NEW) whose parent is missing, in
-- PostgreSQL's words; for a MATCH FULL key (p_full) also of one whose key mixes NULL and non-NULL values, which
-- that check takes too (cow._fk_child_checks).
CREATE OR REPLACE FUNCTION cow._fk_detail(p_cols text[], p_parent text, p_full boolean, p_row text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_full THEN format('CASE WHEN %s THEN %s ELSE %L END', cow._notnull(p_cols, p_row), d.missing,
                                        'MATCH FULL does not allow mixing of null and nonnull key values.')
           ELSE d.missing END
    FROM (SELECT cow._fill($t$format('Key (%s)=(%s) is not present in table "%s".', {{columns|L}}, {{key}}, {{parent|L}})$t$,
                           jsonb_build_object('columns', cow._collist(p_cols), 'key', cow._keytext(p_cols, p_row),
                                              'parent', p_parent)) AS missing) d
$$;

CREATE OR REPLACE FUNCTION cow._fk_child_detail(p_cols text[], p_parent text, p_full boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT cow._fk_detail(p_cols, p_parent, p_full, 'c') $$;

-- The check of FOREIGN KEY p_conname of table p_tab, as the child (23503): a version (of those p_versions
-- selects) whose key p_cols is not in the session's view of the parent (p_missing: a condition on `c`). Sets
-- _seq/_det and, for the first violation, _best and the error.
CREATE OR REPLACE FUNCTION cow._fk_child_check(p_ch text, p_tab text, p_conname text, p_cols text[], p_parent text,
                                               p_missing text, p_versions text, p_full boolean) RETURNS text
LANGUAGE sql IMMUTABLE RETURN cow._fill($t$    SELECT c._cow_seq, {{detail}}
    INTO _seq, _det FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}}
        AND c._cow_current AND c._cow_deleted IS NOT TRUE AND {{missing}}
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23503'; _btab := NULL; _bsch := NULL;
    END IF;
$t$, jsonb_build_object(
    'detail', cow._fk_child_detail(p_cols, p_parent, p_full),
    'changes', p_ch,
    'versions', p_versions,
    'missing', p_missing,
    'constraint', p_conname,
    'message', format('insert or update on table "%s" violates foreign key constraint "%s"', p_tab, p_conname)));

-- The same check for the one version a deferrable key's constraint trigger fired for (p_versions selects it),
-- in three steps that PostgreSQL plans apart: p_cond on NEW (the version as written: only its _cow_current
-- changes later), then whether the version is still current (a probe of <t>_cur by its key), then p_missing,
-- the parent's probes with NEW's key. As one query joining the version to the parent's probes it cost about
-- twice the steps (planned anew at each of a backend's first five events per constraint, and Django checks
-- its deferred keys at the end of every test), and more than them with its generic plan too
-- (docs/benchmarks.md, branch i16lay4).
CREATE OR REPLACE FUNCTION cow._fk_version_check(p_ch text, p_tab text, p_conname text, p_cols text[], p_parent text,
                                                 p_cond text, p_missing text, p_versions text, p_full boolean) RETURNS text
LANGUAGE sql IMMUTABLE RETURN cow._fill($t$    IF {{cond}} THEN
        IF EXISTS (SELECT 1 FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}} AND c._cow_current) THEN
            IF {{missing}} THEN
                _seq := _v;
                _det := {{detail}};
                IF _best IS NULL OR _seq < _best THEN
                    _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23503'; _btab := NULL; _bsch := NULL;
                END IF;
            END IF;
        END IF;
    END IF;
$t$, jsonb_build_object(
    'cond', p_cond,
    'changes', p_ch,
    'versions', p_versions,
    'missing', p_missing,
    'detail', cow._fk_detail(p_cols, p_parent, p_full, 'NEW'),
    'constraint', p_conname,
    'message', format('insert or update on table "%s" violates foreign key constraint "%s"', p_tab, p_conname)));

-- The names cow._fk_parent_check and cow._fk_parent_version_check fill, the key read from p_row (a changes
-- table's alias, or NEW).
CREATE OR REPLACE FUNCTION cow._fk_parent_args(p_ch text, p_conname text, p_message text, p_refcols text[],
                                               p_child_schema text, p_child text, p_gone text, p_referenced text,
                                               p_versions text, p_row text) RETURNS jsonb
LANGUAGE sql IMMUTABLE RETURN jsonb_build_object(
    'columns', cow._collist(p_refcols),
    'key', cow._keytext(p_refcols, p_row),
    'child', p_child,
    'child_schema', p_child_schema,
    'changes', p_ch,
    'versions', p_versions,
    'not_null', cow._notnull(p_refcols, p_row),
    'still_there', p_gone,
    'referenced', p_referenced,
    'constraint', p_conname,
    'message', p_message);

-- The check of NO ACTION FOREIGN KEY p_conname from table p_child, this table as the parent (23503): a
-- tombstone (of those p_versions selects) whose referenced key p_refcols is gone from the session's view of
-- this table (p_gone) and still referenced from the child (p_referenced). Message p_message.
-- The child is probed first (a CASE: PostgreSQL orders a WHERE's conditions by their cost): most tombstones
-- are no longer referenced (the children went first, or there were none), and then the parent's own probes
-- do not run. Ordered by cost, they ran first whenever both were index probes (cow._plan_settings), ~10
-- more buffers per event of a large delete.
CREATE OR REPLACE FUNCTION cow._fk_parent_check(p_ch text, p_conname text, p_message text, p_refcols text[],
                                                p_child_schema text, p_child text, p_gone text, p_referenced text,
                                                p_versions text) RETURNS text
LANGUAGE sql IMMUTABLE RETURN cow._fill($t$    SELECT c._cow_seq, format('Key (%s)=(%s) is still referenced from table "%s".', {{columns|L}}, {{key}}, {{child|L}})
    INTO _seq, _det FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}}
        AND c._cow_current AND c._cow_deleted AND {{not_null}}
        AND CASE WHEN {{referenced}} THEN NOT {{still_there}} ELSE false END
    ORDER BY c._cow_seq LIMIT 1;
    IF _seq IS NOT NULL AND (_best IS NULL OR _seq < _best) THEN
        _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23503'; _btab := {{child|L}}; _bsch := {{child_schema|L}};
    END IF;
$t$, cow._fk_parent_args(p_ch, p_conname, p_message, p_refcols, p_child_schema, p_child, p_gone,
                               p_referenced, p_versions, 'c'));

-- The same check for the one tombstone a deferrable key's constraint trigger fired for (NEW), in steps planned
-- apart as cow._fk_version_check's: NEW a tombstone of a key (a self-referencing key's trigger fires for every
-- version, and on the other versions nothing is planned), still current, referenced, gone.
CREATE OR REPLACE FUNCTION cow._fk_parent_version_check(p_ch text, p_conname text, p_message text, p_refcols text[],
                                                        p_child_schema text, p_child text, p_gone text,
                                                        p_referenced text, p_versions text) RETURNS text
LANGUAGE sql IMMUTABLE RETURN cow._fill($t$    IF NEW._cow_deleted AND {{not_null}} THEN
        IF EXISTS (SELECT 1 FROM {{changes}} c WHERE c._cow_session = _s AND {{versions}} AND c._cow_current) THEN
            IF {{referenced}} THEN
                IF NOT {{still_there}} THEN
                    _seq := _v;
                    _det := format('Key (%s)=(%s) is still referenced from table "%s".', {{columns|L}}, {{key}}, {{child|L}});
                    IF _best IS NULL OR _seq < _best THEN
                        _best := _seq; _bdet := _det; _bcon := {{constraint|L}}; _bmsg := {{message|L}}; _bcode := '23503'; _btab := {{child|L}}; _bsch := {{child_schema|L}};
                    END IF;
                END IF;
            END IF;
        END IF;
    END IF;
$t$, cow._fk_parent_args(p_ch, p_conname, p_message, p_refcols, p_child_schema, p_child, p_gone,
                               p_referenced, p_versions, 'NEW'));

-- FOREIGN KEYs of the context's table as the child (23503), keyed or keyless: the parent must be in the
-- session's view of the parent. Checked at the end of the statement like PostgreSQL's RI triggers (so a later row's
-- NOT NULL, CHECK or UNIQUE error wins over an earlier row's missing parent): `fk_checks` goes in the
-- statement trigger (cow._fk_statement_triggers); a deferrable one is checked by a constraint trigger on the
-- changes table instead (at COMMIT when deferred): check number dn + 1 on in `dq` (the one version
-- row_version selects) and `dq_stmt`, trigger `dtrg` (cow._defer_trigger), its bit in `dbits` (it stays on
-- the row's later versions, so an update that leaves the key alone still carries the check). Each key has a
-- bit in `_cow_fk` (`fk_all`: all of them, `fk_changed`: those whose columns an UPDATE changed; either only
-- while no column of the key is NULL); `fk_n` keys.
CREATE OR REPLACE FUNCTION cow._fk_child_checks(ctx cow.trigger_context) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    con record;
    found text;
    missing text;
    checked text;
    bit text;
    found_new text;  -- (the same probes with the constraint trigger's NEW: cow._fk_version_check)
    cond_new text;
    missing_new text;
BEGIN
    ctx.fk_all := '0';
    ctx.fk_changed := '0';
    ctx.dbits := '0';
    ctx.fk_n := 0;
    FOR con IN SELECT c.conname, cow._attnames(c.conrelid, c.conkey) AS cols, c.confrelid,
                      cow._attnames(c.confrelid, c.confkey) AS refcols, pr.relname AS parent,
                      c.condeferrable, c.condeferred, c.confmatchtype = 'f' AND cardinality(c.conkey) > 1 AS match_full
               FROM pg_constraint c JOIN pg_class pr ON pr.oid = c.confrelid
               WHERE c.conrelid = ctx.rel AND c.contype = 'f' ORDER BY c.conname LOOP
        IF con.condeferrable THEN
            -- (Checked at COMMIT too: the parent looked up by index in the session's view, cow._sexists.)
            found := cow._sexists(con.confrelid, cow._eq2(con.refcols, 'z', con.cols, 'c'), con.refcols);
            found_new := cow._sexists(con.confrelid, cow._eq2(con.refcols, 'z', con.cols, 'NEW'), con.refcols);
        ELSE
            found := format('EXISTS (SELECT 1 FROM %s z WHERE %s)', cow._session_rel(con.confrelid),
                            cow._eq2(con.refcols, 'z', con.cols, 'c'));
        END IF;
        -- A key with a NULL column references nothing (MATCH SIMPLE); a MATCH FULL key references nothing only
        -- when all its columns are NULL, and one that mixes NULL and non-NULL values is an error of its own.
        IF con.match_full THEN
            missing := format('NOT (%s) AND (NOT (%s) OR NOT %s)', cow._allnull(con.cols, 'c'),
                              cow._notnull(con.cols, 'c'), found);
            checked := format('NOT (%s)', cow._allnull(con.cols, 'NEW'));
            missing_new := format('NOT (%s) OR NOT %s', cow._notnull(con.cols, 'NEW'), found_new);
        ELSE
            missing := format('%s AND NOT %s', cow._notnull(con.cols, 'c'), found);
            checked := cow._notnull(con.cols, 'NEW');
            missing_new := format('NOT %s', found_new);
        END IF;
        bit := (1 << least(ctx.fk_n, 30))::text;
        cond_new := format('NEW._cow_deleted IS NOT TRUE AND (NEW._cow_fk & %s) <> 0 AND %s', bit, checked);
        IF con.confrelid = ctx.rel THEN
            -- A row may reference itself (a mixed MATCH FULL key never does: the comparison is not true).
            missing := missing || format(CASE WHEN con.match_full THEN ' AND (%s) IS NOT TRUE' ELSE ' AND NOT (%s)' END,
                                         cow._eq2(con.refcols, 'c', con.cols, 'c'));
            cond_new := cond_new || format(CASE WHEN con.match_full THEN ' AND (%s) IS NOT TRUE' ELSE ' AND NOT (%s)' END,
                                           cow._eq2(con.refcols, 'NEW', con.cols, 'NEW'));
        END IF;
        -- (A key that references nothing gives its version no bit, so no check runs for it, and a deferrable
        -- one's constraint trigger does not fire.)
        ctx.fk_all := ctx.fk_all || format(' | CASE WHEN %s THEN %s ELSE 0 END', checked, bit);
        ctx.fk_changed := ctx.fk_changed || format(' | CASE WHEN %s AND %s THEN %s ELSE 0 END', cow._changed(con.cols),
                                                   checked, bit);
        missing := missing || format(' AND (c._cow_fk & %s) <> 0', bit);
        IF con.condeferrable THEN
            ctx.dbits := ctx.dbits || format(' | %s', bit);
            ctx.dn := ctx.dn + 1;
            ctx.dq := ctx.dq || cow._defer_branch(ctx.dn, cow._fk_version_check(ctx.ch, ctx.tab, con.conname, con.cols,
                                                                                con.parent, cond_new, missing_new,
                                                                                ctx.row_version, con.match_full), false);
            ctx.dq_stmt := ctx.dq_stmt || cow._defer_branch(ctx.dn, cow._fk_child_check(ctx.ch, ctx.tab, con.conname,
                                                                                        con.cols, con.parent, missing,
                                                                                        'c._cow_seq > _mark', con.match_full), true);
            ctx.dtrg := cow._defer_trigger(ctx.dtrg, con.conname, con.condeferred, format('(NEW._cow_fk & %s) <> 0', bit),
                                           ctx.dn);
        ELSE
            ctx.fk_checks := ctx.fk_checks || cow._fk_child_check(ctx.ch, ctx.tab, con.conname, con.cols, con.parent,
                                                                  missing, 'c._cow_seq > _mark', con.match_full);
        END IF;
        ctx.fk_n := ctx.fk_n + 1;
    END LOOP;
    -- The statement mark's GUC: a table without FOREIGN KEYs has 0 bits in every version, nothing to carry
    -- from the previous one.
    ctx.mark_guc := CASE WHEN ctx.fk_n > 0 THEN 'cow._mark_' || ctx.changes_table END;
    RETURN ctx;
END $gen$;

-- The statement-level FOREIGN KEY triggers of table p_id's overlay view, keyed or keyless: `cow_fk_mark`
-- (BEFORE STATEMENT: pushes the current write sequence value onto the GUC `cow._mark_<t>`) and `cow_fk_check`
-- (AFTER STATEMENT: runs p_checks over this session's versions written since, and p_deferred, the deferrable
-- constraints flagged inside the statement, cow._defer_branch), raising the first violation. p_vars: the
-- variables those checks use beyond the common ones. Without checks the triggers go.
CREATE OR REPLACE FUNCTION cow._fk_statement_triggers(p_id int, p_checks text, p_deferred text, p_vars text)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    v text;
    mark text;
    check_fn text;
    dq_fn text;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    v := format('%I.%I', r.overlay_schema, r.table_name);
    IF p_checks = '' AND p_deferred = '' THEN
        EXECUTE format('DROP TRIGGER IF EXISTS cow_fk_mark ON %s', v);
        EXECUTE format('DROP TRIGGER IF EXISTS cow_fk_check ON %s', v);
        RETURN;
    END IF;
    mark := format('cow_changes.%I', r.changes_table || '_mark');
    -- (The mark is pushed in a session or not, and cow_fk_check pops it before it asks for the session: a
    -- write costs no lookup of the binding for its mark; outside a session nothing reads the mark. The mark is
    -- the last value cow.write_seq handed out, 0 before the first: pg_sequence_last_value is NULL then, and
    -- nothing moves the sequence back. A simple expression, not a query of the sequence: no plan, no executor
    -- start at each write statement. The generated code assigns set_config's result rather than PERFORM it:
    -- PL/pgSQL runs a PERFORM through the executor, an assignment of a simple expression without it, ~15,000
    -- instructions less a statement.)
    check_fn := format('cow_changes.%I', r.changes_table || '_fkcheck');
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql AS $body$
DECLARE
    _g text;
BEGIN
    _g := set_config({{mark|L}}, concat_ws(',', nullif(current_setting({{mark|L}}, true), ''),
        coalesce(pg_catalog.pg_sequence_last_value('cow.write_seq'::pg_catalog.regclass), 0)::text), true);
    RETURN NULL;
END $body$$t$, jsonb_build_object('fn', mark, 'mark', 'cow._mark_' || r.changes_table));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_fk_mark BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()', v, mark);
    -- The deferrable constraints flagged inside the statement (IMMEDIATE mode) are checked by their own
    -- function, `<t>_fkdq`: PL/pgSQL compiles a function's whole body at its first call in a backend, and
    -- this path runs only after SET CONSTRAINTS ... IMMEDIATE before a write, while the statement trigger
    -- runs at every write statement (docs/benchmarks.md, "A table's first use in a new backend").
    dq_fn := format('cow_changes.%I', r.changes_table || '_fkdq');
    IF p_deferred = '' THEN
        EXECUTE format('DROP FUNCTION IF EXISTS %s(text, bigint, bigint)', dq_fn);
    ELSE
        -- (No SET clause: only <t>_fkcheck calls it, with its settings in force.) Raises the first violation
        -- of the flagged constraints when it comes before p_best, the statement's own (like the checks below,
        -- which keep the earlier one); clears the flags at the outermost statement.
        EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}(_marks text, _mark bigint, _best bigint) RETURNS text
LANGUAGE plpgsql AS $body$
DECLARE
    _g text := pg_catalog.current_setting({{flags|L}}, true);
    _s text;
    _seq bigint;
    _det text;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text;
    _btab text;
    _bsch text;
    _cfg text;
{{vars}}BEGIN
    IF regexp_replace(_marks, ',?[^,]*$', '') = '' THEN
        _cfg := pg_catalog.set_config({{flags|L}}, '', true);
    END IF;
    _s := cow._session();
{{checks}}    IF _bmsg IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, {{schema|L}}), TABLE = coalesce(_btab, {{table|L}}), CONSTRAINT = _bcon;
    END IF;
    RETURN NULL;
END $body$$t$, jsonb_build_object('fn', dq_fn, 'flags', 'cow._dq_' || r.changes_table, 'vars', p_vars,
                                  'checks', p_deferred, 'schema', r.table_schema, 'table', r.table_name));
    END IF;
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
DECLARE
    _s text;
    _marks text := current_setting({{mark|L}}, true);
    _mark bigint;
    _seq bigint;
    _det text;
    _best bigint;
    _bdet text;
    _bcon text;
    _bmsg text;
    _bcode text := '23503';
    _btab text;
    _bsch text;
    _g text;
{{vars}}BEGIN
    IF coalesce(_marks, '') = '' THEN
        RETURN NULL;
    END IF;
    _mark := split_part(_marks, ',', -1)::bigint;
    _g := set_config({{mark|L}}, regexp_replace(_marks, ',?[^,]*$', ''), true);
{{session}}{{checks}}{{deferred}}{{raise}}    RETURN NULL;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', check_fn,
        'mark', 'cow._mark_' || r.changes_table,
        'vars', CASE WHEN p_checks = '' THEN '' ELSE p_vars END,
        -- The session is asked for only when there is something to check: the statement's checks, or the
        -- flags below (a table whose FOREIGN KEYs are all deferrable, in DEFERRED mode, pops its mark only).
        'session', CASE WHEN p_checks = '' THEN '' ELSE $t$    _s := cow._session();
    IF _s IS NULL THEN
        RETURN NULL;
    END IF;
$t$ END,
        'checks', p_checks,
        -- Deferrable constraints whose trigger fired inside this statement (IMMEDIATE mode): checked at the
        -- end of the statement, like PostgreSQL, by <t>_fkdq; the outermost statement clears the flags.
        -- (Flags are only set in a session: the constraint triggers are on the changes table.)
        'deferred', CASE WHEN p_deferred = '' THEN '' ELSE cow._fill($t$    IF coalesce(pg_catalog.current_setting({{flags|L}}, true), '') <> '' THEN
        _g := {{fn}}(_marks, _mark, _best);
    END IF;
$t$, jsonb_build_object('flags', 'cow._dq_' || r.changes_table, 'fn', dq_fn)) END,
        -- (Only the statement's own checks set _best: the flagged ones raise in <t>_fkdq.)
        'raise', CASE WHEN p_checks = '' THEN '' ELSE cow._fill($t$    IF _best IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = _bcode, MESSAGE = _bmsg,
            DETAIL = _bdet, SCHEMA = coalesce(_bsch, {{schema|L}}), TABLE = coalesce(_btab, {{table|L}}), CONSTRAINT = _bcon;
    END IF;
$t$, jsonb_build_object('schema', r.table_schema, 'table', r.table_name)) END));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_fk_check AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()', v, check_fn);
END $gen$;

-- ---------------------------------------------------------------------------------------------------------
-- The INSTEAD OF triggers, one generator per generated object, over the table's context
-- ---------------------------------------------------------------------------------------------------------
-- cow.trigger_context (migrations 0010, 0011) is what the steps at the end of this file collect for one
-- table (names, the per-row checks, the key's checks, the FOREIGN KEY bits and actions); each generator
-- below writes one trigger function from it, with named template slots (cow._fill), and creates the trigger
-- that calls it.

-- The settings every generated trigger function runs with (`SET` clauses of the function: restored when it
-- returns). PL/pgSQL keeps a generic plan of each of its statements for the backend's life, made at the
-- statement's sixth run. A changes table that a vacuum left empty and small then counts as a page or none,
-- and on it a sequential scan costs less than any index probe; every later row of that backend would then scan
-- the session's whole changes table (quadratic: docs/benchmarks.md, "Trigger plans on small vacuumed
-- tables"). Without sequential scans the probes use the index their conditions pin: <t>_cur for a key (no
-- lookup index can serve a probe by key: cow._live), <t>_log for a statement's versions since its mark.
-- (On PostgreSQL 15 a disabled path still costs 1e10, which would put a statement that has no other path, a
-- table without an index on a foreign key's columns, over jit_above_cost: JIT at every run. No trigger
-- statement gains from JIT.) And the generic plan from the first run (plan_cache_mode): before, each of a
-- statement's first five runs in a backend made a custom plan, and a new backend (every client connection
-- without reused server connections) paid them for every table it wrote (docs/benchmarks.md, "A table's
-- first use in a new backend").
CREATE OR REPLACE FUNCTION cow._plan_settings() RETURNS text
LANGUAGE sql IMMUTABLE
RETURN 'SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan';

-- INSERT (keyed and keyless): the base table without a session, else the checks, then the new version.
CREATE OR REPLACE FUNCTION cow._gen_insert(c cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fn text := format('cow_changes.%I', c.changes_table || '_ins');
    rec text;
    ins int;
BEGIN
    IF c.keyless THEN
        -- One added row value.
        rec := cow._fill($t$    INSERT INTO {{changes}} (_cow_session, _cow_op, _cow_deleted, _cow_fk, {{columns}}) VALUES (_s, _o, false, {{fk_bits}}, {{values}});
$t$, jsonb_build_object('changes', c.ch, 'columns', cow._collist(c.names),
                        'fk_bits', CASE WHEN c.fk_n = 0 THEN '0' ELSE c.fk_all END,
                        'values', cow._collist(c.names, 'NEW.')));
    ELSE
        -- (With the primary-key probe, a key the session holds no version of passed the check only if the base
        -- table has no row with it either: no base snapshot, and commit's conflict check sees a row inserted
        -- into the base meanwhile.)
        rec := cow._rec_code(c.ch, c.b, c.names, c.pk, 'NEW', false, c.fk_all, c.mark_guc, 'NULL',
                             CASE WHEN c.pk_probe THEN 'NULL' END);
        IF c.pk_probe THEN
            -- (_rec_code: retire the current version, then insert the new one; the retire only after a tombstone.)
            ins := strpos(rec, E'\n    INSERT INTO ');
            rec := format(E'    IF _pdel IS NOT NULL THEN\n%s    END IF;\n%s', substr(rec, 1, ins), substr(rec, ins + 1));
        END IF;
    END IF;
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
{{declare}}BEGIN
{{registry_check}}{{defaults}}    IF _s IS NULL THEN
        INSERT INTO {{base}} AS y ({{columns}}) {{overriding}} VALUES ({{values}}) RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
{{generated}}{{not_null}}{{checks}}{{unique}}{{record}}    RETURN NEW;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', fn,
        'declare', c.decl,
        'registry_check', c.reg_code,
        'defaults', c.dflt_ins,
        'base', c.b,
        'columns', cow._collist(c.ncols),
        'overriding', CASE WHEN c.has_always THEN 'OVERRIDING SYSTEM VALUE' ELSE '' END,
        'values', cow._collist(c.ncols, 'NEW.'),
        'generated', c.gen_code,
        'not_null', c.nn_code,
        'checks', c.chk_code,
        'unique', c.uq_ins,
        'record', rec));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_insert INSTEAD OF INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()', c.v, fn);
END $gen$;

-- UPDATE of a keyed table: a primary-key change is a delete of the old key and a write of the new one.
CREATE OR REPLACE FUNCTION cow._gen_update(c cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fn text := format('cow_changes.%I', c.changes_table || '_upd');
    moved text := cow._changed(c.pk);
BEGIN
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
{{declare}}BEGIN
{{registry_check}}{{defaults}}    IF _s IS NULL THEN
        UPDATE {{base}} AS y SET ({{columns}}) = ROW({{values}}) WHERE {{same_key}} RETURNING y.* INTO NEW;
        RETURN NEW;
    END IF;
    _o := cow._write_operation();
{{lock_wait}}{{generated}}{{not_null}}{{checks}}{{unique}}{{parent_checks}}    IF {{key_moved}} THEN
{{retire_old_key}}    END IF;
{{record}}{{parent_actions}}    RETURN NEW;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', fn,
        'declare', c.decl,
        'registry_check', c.reg_code,
        'defaults', c.dflt_upd,
        'base', c.b,
        'columns', cow._collist(c.setcols),
        'values', cow._collist(c.setcols, 'NEW.'),
        'same_key', cow._eq(c.pk, 'y', 'OLD'),
        -- (Row locks of other transactions of the session: 90_row_locks.sql.)
        'lock_wait', cow._row_lock_wait_code(c.changes_table, c.pk, 'OLD', moved),
        'generated', c.gen_code,
        'not_null', c.nn_code,
        'checks', c.chk_code,
        'unique', c.uq_upd,
        'parent_checks', c.par_upd_check,
        'key_moved', moved,
        -- A primary-key move remembers the base key it started from (commit applies it as an UPDATE).
        'retire_old_key',
            cow._rec_code(c.ch, c.b, c.names, c.pk, 'OLD', true, snap => 'true',
                          stale => cow._unchanged_since(c.rel, c.names, 'OLD'), conflict => c.stale_raise)
            || format(E'    _morig := CASE WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END;\n',
                      cow._jsonargs(c.pk, 'OLD')),
        'record',
            cow._rec_code(c.ch, c.b, c.names, c.pk, 'NEW', false,
                          CASE WHEN c.dbits = '0' THEN c.fk_changed
                               -- (Deferrable FOREIGN KEYs: still to check when an earlier version was, and all
                               -- of them after a primary-key move.)
                               ELSE format('%s | (coalesce(_pfk, 0) & (%s)) | CASE WHEN %s THEN %s ELSE 0 END',
                                           c.fk_changed, c.dbits, moved, c.dbits) END,
                          c.mark_guc,
                          format('CASE WHEN %s THEN _morig WHEN _seen IS NULL THEN pg_catalog.jsonb_build_object(%s) ELSE _porig END',
                                 moved, cow._jsonargs(c.pk, 'NEW')),
                          'NOT ' || moved,
                          -- (A key move writes a new key: its current version can only be a tombstone.)
                          format('(%s OR %s)', moved, cow._unchanged_since(c.rel, c.names, 'OLD')),
                          format(E'IF %s THEN\n            %s\n        ELSE\n            %s\n        END IF;',
                                 moved, c.dup_raise, c.stale_raise)),
        'parent_actions', c.par_upd_act));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_update INSTEAD OF UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', c.v, fn);
END $gen$;

-- DELETE of a keyed table: a tombstone of the key.
CREATE OR REPLACE FUNCTION cow._gen_delete(c cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fn text := format('cow_changes.%I', c.changes_table || '_del');
BEGIN
    EXECUTE cow._fill($t$CREATE OR REPLACE FUNCTION {{fn}}() RETURNS trigger LANGUAGE plpgsql {{plans}} AS $body$
{{declare}}BEGIN
{{registry_check}}    IF _s IS NULL THEN
        DELETE FROM {{base}} AS y WHERE {{same_key}};
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        RETURN OLD;
    END IF;
    _o := cow._write_operation();
{{lock_wait}}{{parent_checks}}{{record}}{{parent_actions}}    RETURN OLD;
END $body$$t$, jsonb_build_object(
        'plans', cow._plan_settings(),
        'fn', fn,
        'declare', c.decl,
        'registry_check', c.reg_code,
        'base', c.b,
        'same_key', cow._eq(c.pk, 'y', 'OLD'),
        'lock_wait', cow._row_lock_wait_code(c.changes_table, c.pk, 'OLD', 'true'),
        'parent_checks', c.par_del_check,
        'record', cow._rec_code(c.ch, c.b, c.names, c.pk, 'OLD', true, snap => 'true',
                                stale => cow._unchanged_since(c.rel, c.names, 'OLD'), conflict => c.stale_raise),
        'parent_actions', c.par_del_act));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_delete INSTEAD OF DELETE ON %s FOR EACH ROW EXECUTE FUNCTION %s()', c.v, fn);
END $gen$;

-- ---------------------------------------------------------------------------------------------------------
-- A table's context, collected in steps (keyed and keyless tables share all but the key's)
-- ---------------------------------------------------------------------------------------------------------
-- What every table's triggers read: its names, its columns, the registry check, the per-row checks
-- (cow._row_checks), and empty collections for the steps below to fill.
CREATE OR REPLACE FUNCTION cow._trigger_context(p_id int) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    ctx cow.trigger_context;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    ctx.changes_table := r.changes_table;
    ctx.rel := r.relid;
    ctx.keyless := r.pk_columns = '{}';
    ctx.sch := r.table_schema;
    ctx.tab := r.table_name;
    ctx.ch := format('cow_changes.%I', r.changes_table);
    ctx.v := format('%I.%I', r.overlay_schema, r.table_name);
    ctx.b := format('%I.%I', r.table_schema, r.table_name);
    ctx.names := r.col_names;
    ctx.pk := r.pk_columns;
    -- ncols: not generated, what an INSERT into the base table names; setcols: what an UPDATE of it sets (no
    -- generated, no GENERATED ALWAYS identity).
    SELECT array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = ''),
           array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '' AND a.attidentity <> 'a'),
           bool_or(a.attidentity = 'a')
    INTO ctx.ncols, ctx.setcols, ctx.has_always
    FROM pg_attribute a WHERE a.attrelid = ctx.rel AND a.attnum > 0 AND NOT a.attisdropped;
    ctx.decl := CASE WHEN ctx.keyless
        THEN E'DECLARE\n    _s text := cow._session();\n    _o text;\n    _g text;\n    _bad text;\n    _ret bigint;\n    _pfk int;\n'
        ELSE E'DECLARE\n    _s text := cow._session();\n    _o text;\n    _g text;\n    _base jsonb;\n    _seen boolean;\n    _bad text;\n    _pfk int;\n    _pseq bigint;\n    _porig jsonb;\n    _morig jsonb;\n    _pdel boolean;\n' END;
    -- The version a constraint trigger fires for: found by key (keyless: by sequence) in <t>_cur.
    ctx.row_version := CASE WHEN ctx.keyless THEN 'c._cow_seq = _v'
                            ELSE format('%s AND c._cow_seq = _v', cow._eq(ctx.pk, 'c', 'NEW')) END;
    -- The registry check (cow._write_session) runs only when the stamp it left for the connection does not
    -- match (cow._open_stamp: another session or operation id, a session closed since, the next second); the
    -- match is one expression, no query (a lookup of the registry row in every autocommit write cost ~20-35 us).
    -- (Assigned, not PERFORMed: a simple expression, no executor run of its own around the call.)
    ctx.reg_code := E'    IF _s IS NOT NULL AND pg_catalog.current_setting(''cow._open'', true) IS DISTINCT FROM cow._open_stamp(_s) THEN\n'
                     '        _g := cow._write_session();\n'
                     '    END IF;\n';
    SELECT * INTO ctx.dflt_ins, ctx.dflt_upd, ctx.gen_code, ctx.nn_code, ctx.chk_code
    FROM cow._row_checks(ctx.rel, ctx.changes_table, ctx.names, ctx.ncols, ctx.sch, ctx.tab);
    ctx.uq_ins := '';
    ctx.uq_upd := '';
    ctx.pk_probe := false;
    ctx.par_del_check := '';
    ctx.par_upd_check := '';
    ctx.par_del_act := '';
    ctx.par_upd_act := '';
    ctx.fk_checks := '';
    ctx.dn := 0;
    ctx.dq := '';
    ctx.dq_stmt := '';
    ctx.dtrg := '{}';
    RETURN ctx;
END $gen$;

-- The 23505 of unique constraint p_name over cols, as PostgreSQL words it.
CREATE OR REPLACE FUNCTION cow._duplicate_raise(cols text[], p_name text, sch text, tab text) RETURNS text
LANGUAGE sql IMMUTABLE
RETURN cow._raise('23505', format('duplicate key value violates unique constraint "%s"', p_name),
                  format('format(''Key (%%s)=(%%s) already exists.'', %L, %s)', cow._collist(cols),
                         cow._keytext(cols, 'NEW')), sch, tab, p_name);

-- PRIMARY KEY and UNIQUE (23505), and exclusion constraints (23P01), of a keyed table against the session's
-- view of the table, in index creation order like PostgreSQL: the deferrable ones' checks and triggers
-- (cow._defer_*; a deferrable PRIMARY KEY stays checked at once: the changes table holds one version per
-- key, so two rows cannot share a key even for a moment), partial and expression UNIQUE indexes and exclusion
-- constraints (cow._xcheck_code, each with a record variable in the DECLARE section), the plain ones
-- (cow._unique_checks). The key index (cow._key_index: the primary key, or the NOT NULL unique index that
-- stands in for it) is `prim`: its 23505 names it, like PostgreSQL. Also what an UPDATE or DELETE raises when
-- another transaction of the session wrote the key's current version meanwhile (cow._rec_code): a key it
-- moves to is the table's 23505 (dup_raise), a changed row 40001 (stale_raise).
CREATE OR REPLACE FUNCTION cow._key_checks(ctx cow.trigger_context) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    keyidx oid := cow._key_index(ctx.rel);
    con record;
    xn int := 0;
BEGIN
    FOR con IN SELECT x.indexrelid AS idx, ic.relname AS name,
                      cow._attnames(ctx.rel, (x.indkey::int2[])[0:x.indnkeyatts - 1]) AS cols,
                      x.indnullsnotdistinct AS nnd, x.indexrelid = keyidx AS prim,
                      x.indisunique AND NOT x.indisexclusion AND x.indpred IS NULL AND x.indexprs IS NULL AS plain,
                      coalesce(d.condeferrable AND x.indexrelid <> keyidx, false) AS deferrable,
                      coalesce(d.condeferred, false) AS deferred
               FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid
               LEFT JOIN pg_constraint d ON d.conindid = x.indexrelid AND d.conrelid = ctx.rel
                                        AND d.contype IN ('p', 'u', 'x')
               WHERE x.indrelid = ctx.rel AND (x.indisunique OR x.indisexclusion)
               ORDER BY x.indexrelid LOOP
        IF con.deferrable THEN
            ctx.dn := ctx.dn + 1;
            ctx.dq := ctx.dq || cow._defer_branch(ctx.dn, cow._defer_unique_code(ctx.rel, con.idx, ctx.b, ctx.ch,
                                                                                  ctx.pk, ctx.row_version), false);
            ctx.dq_stmt := ctx.dq_stmt || cow._defer_branch(ctx.dn, cow._defer_unique_code(ctx.rel, con.idx, ctx.b,
                                                                                            ctx.ch, ctx.pk,
                                                                                            'c._cow_seq > _mark'), true);
            ctx.dtrg := cow._defer_trigger(ctx.dtrg, con.name, con.deferred, 'NOT NEW._cow_deleted', ctx.dn);
        ELSIF NOT con.plain THEN
            xn := xn + 1;
            ctx.decl := ctx.decl || format(E'    _cow_k%s record;\n', xn)
                        || CASE WHEN xn = 1 THEN E'    _cow_c record;\n' ELSE '' END;
            ctx.uq_ins := ctx.uq_ins || cow._xcheck_code(ctx.rel, con.idx, false, '_cow_k' || xn, ctx.b, ctx.ch,
                                                         ctx.names, ctx.pk, ctx.sch, ctx.tab);
            ctx.uq_upd := ctx.uq_upd || cow._xcheck_code(ctx.rel, con.idx, true, '_cow_k' || xn, ctx.b, ctx.ch,
                                                         ctx.names, ctx.pk, ctx.sch, ctx.tab);
        ELSE
            ctx := cow._unique_checks(ctx, con.cols, con.name, con.nnd, con.prim);
        END IF;
    END LOOP;
    ctx.dup_raise := cow._duplicate_raise(ctx.pk, (SELECT ic.relname FROM pg_class ic WHERE ic.oid = keyidx),
                                          ctx.sch, ctx.tab);
    -- (Its HINT says whether the proxy may run a statement alone in its transaction again: cow._row_changed_hint.)
    ctx.stale_raise := format('RAISE EXCEPTION USING ERRCODE = %L, MESSAGE = %L, DETAIL = %s, HINT = cow._row_changed_hint(), '
                              'SCHEMA = %L, TABLE = %L;',
                              '40001', 'could not serialize access due to concurrent update',
                              format('format(%L, _s, %s)',
                                     format('Another transaction of session %%s changed the row of "%s" with '
                                            'key (%s)=(%%s) after this statement read it.',
                                            ctx.tab, cow._collist(ctx.pk)),
                                     cow._keytext(ctx.pk, 'OLD')), ctx.sch, ctx.tab);
    RETURN ctx;
END $gen$;

-- A plain UNIQUE index p_name over cols (or the key index, p_prim): the INSERT's and the UPDATE's 23505
-- check against the session's view of the table spelled out: its current versions (the changes table's
-- index for this constraint), then base rows it holds no version of (a per-row probe, `OFFSET 0`). Through
-- the overlay view every check initialised the plan of all three branches (~25 us per write). With NULLS
-- NOT DISTINCT (p_nnd) NULLs are equal too.
CREATE OR REPLACE FUNCTION cow._unique_checks(ctx cow.trigger_context, cols text[], p_name text, p_nnd boolean,
                                              p_prim boolean) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    dup text := cow._duplicate_raise(cols, p_name, ctx.sch, ctx.tab);
    not_null text := CASE WHEN p_nnd THEN '' ELSE cow._notnull(cols, 'NEW') || ' AND ' END;
    cond text := cow._eq(cols, 'z', 'NEW');
    eq_cols text[] := cols;  -- (the columns cond sets equal: cow._view_exists)
BEGIN
    -- (The key's columns are NOT NULL: plain equality, an index probe, even with NULLS NOT DISTINCT.)
    IF p_nnd AND NOT p_prim THEN
        cond := (SELECT string_agg(format('z.%I IS NOT DISTINCT FROM NEW.%I', c, c), ' AND ') FROM unnest(cols) AS c);
        eq_cols := '{}';
    END IF;
    IF p_prim AND cols = ctx.pk THEN
        -- The primary key of an INSERT: one lookup of the session's current version of the key tells both
        -- the conflict and whether there is a version (a tombstone) to retire, so an INSERT of a key the
        -- session never wrote skips the retiring UPDATE (~10 us).
        ctx.pk_probe := true;
        ctx.uq_ins := ctx.uq_ins || cow._fill($t$    SELECT c._cow_deleted INTO _pdel FROM {{changes}} c WHERE c._cow_session = _s AND c._cow_current AND {{key}};
    IF _pdel IS FALSE OR (_pdel IS NULL AND EXISTS (SELECT 1 FROM {{base}} z WHERE {{equal}})) THEN
        {{raise}}
    END IF;
$t$, jsonb_build_object('changes', ctx.ch, 'key', cow._eq(ctx.pk, 'c', 'NEW'), 'base', ctx.b, 'equal', cond,
                        'raise', dup));
    ELSE
        ctx.uq_ins := ctx.uq_ins || cow._fill($t$    IF {{not_null}}({{taken}}) THEN
        {{raise}}
    END IF;
$t$, jsonb_build_object('not_null', not_null, 'raise', dup,
                        'taken', cow._view_exists(ctx.ch, ctx.b, ctx.pk, cond, 'c', eq_cols)));
    END IF;
    -- An UPDATE that leaves the key alone cannot create a duplicate; the nested IF keeps the query (and its
    -- executor start-up) off that path.
    ctx.uq_upd := ctx.uq_upd || cow._fill($t$    IF {{changed}} THEN
        IF {{not_null}}({{taken}}) THEN
            {{raise}}
        END IF;
    END IF;
$t$, jsonb_build_object('changed', cow._changed(cols), 'not_null', not_null, 'raise', dup,
                        'taken', cow._view_exists(ctx.ch, ctx.b, ctx.pk,
                                                  format('%s AND NOT (%s)', cond, cow._eq(ctx.pk, 'z', 'OLD')), 'c',
                                                  eq_cols)));
    RETURN ctx;
END $gen$;

-- FOREIGN KEY, a keyed table as the parent, one step per constraint that references it (`fk`, the row of
-- the query below): NO ACTION checked at the end of the statement (cow._fk_no_action), the refusals and the
-- ON DELETE / ON UPDATE actions within the session (cow._fk_parent_delete, cow._fk_parent_update).
CREATE OR REPLACE FUNCTION cow._fk_parent_checks(ctx cow.trigger_context) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    fk record;
BEGIN
    FOR fk IN SELECT c.conname, c.conrelid, cow._attnames(c.conrelid, c.conkey) AS cols,
                     cow._attnames(c.confrelid, c.confkey) AS refcols, c.confdeltype, c.confupdtype,
                     cow._attnames(c.conrelid, c.confdelsetcols) AS delsetcols, ck.relname AS child,
                     (SELECT nspname FROM pg_namespace WHERE oid = ck.relnamespace) AS child_schema,
                     c.condeferrable, c.condeferred,
                     EXISTS (SELECT 1 FROM cow.registry g WHERE g.relid = c.conrelid) AS child_cow,
                     cow._session_rel(c.conrelid) AS target,
                     format('update or delete on table "%s" violates foreign key constraint "%s" on table "%s"',
                            ctx.tab, c.conname, ck.relname) AS msg
              FROM pg_constraint c JOIN pg_class ck ON ck.oid = c.conrelid
              WHERE c.oid IN (SELECT f.oid FROM cow._fks_to(ctx.rel) AS f(oid)) ORDER BY c.conname LOOP
        -- (A child table outside the layer cannot change in a session: any action is a refusal there.)
        IF (fk.confdeltype = 'a' OR fk.confupdtype = 'a') AND fk.child_cow THEN
            ctx := cow._fk_no_action(ctx, fk);
        END IF;
        ctx := cow._fk_parent_delete(ctx, fk);
        ctx := cow._fk_parent_update(ctx, fk);
    END LOOP;
    RETURN ctx;
END $gen$;

-- The 23503 (or 23001) of FOREIGN KEY fk (cow._fk_parent_checks) refusing p_action ('d' delete, 'u'
-- update) of a referenced key: RESTRICT raises 23001 from PostgreSQL 18 on (23503 before); NO ACTION, and the
-- refusal for a plain child, 23503.
CREATE OR REPLACE FUNCTION cow._fk_parent_raise(fk record, p_action "char") RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    RETURN cow._raise(CASE WHEN CASE p_action WHEN 'd' THEN fk.confdeltype ELSE fk.confupdtype END = 'r'
                                AND fk.child_cow AND current_setting('server_version_num')::int >= 180000
                           THEN '23001' ELSE '23503' END,
                      fk.msg,
                      format('format(''Key (%%s)=(%%s) is still referenced from table "%%s".'', %L, %s, %L)',
                             cow._collist(fk.refcols), cow._keytext(fk.refcols, 'OLD'), fk.child),
                      fk.child_schema, fk.child, fk.conname);
END $gen$;

-- NO ACTION is checked at the end of the statement, like PostgreSQL (so `DELETE FROM t` of a whole
-- self-referencing tree works): the statement's tombstones whose key is gone from the session's view must
-- not be referenced (fk_checks); a deferrable one when its constraint trigger fires (dq, dq_stmt). (A
-- referenced key that is not the primary key and changes in place is still checked at once.)
CREATE OR REPLACE FUNCTION cow._fk_no_action(ctx cow.trigger_context, fk record) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    gone text;
    referenced text;
BEGIN
    IF NOT fk.condeferrable THEN
        gone := format('EXISTS (SELECT 1 FROM %s z WHERE %s)', ctx.v, cow._eq(fk.refcols, 'z', 'c'));
        referenced := format('EXISTS (SELECT 1 FROM %s k WHERE %s)', fk.target, cow._eq2(fk.cols, 'k', fk.refcols, 'c'));
        ctx.fk_checks := ctx.fk_checks || cow._fk_parent_check(ctx.ch, fk.conname, fk.msg, fk.refcols, fk.child_schema,
                                                               fk.child, gone, referenced, 'c._cow_seq > _mark');
        RETURN ctx;
    END IF;
    -- The tombstones of deleted (or moved) referenced keys, checked when the trigger fires.
    gone := cow._sexists(ctx.rel, cow._eq(fk.refcols, 'z', 'c'), fk.refcols);
    referenced := cow._sexists(fk.conrelid, cow._eq2(fk.cols, 'z', fk.refcols, 'c'), fk.cols);
    ctx.dn := ctx.dn + 1;
    ctx.dq := ctx.dq || cow._defer_branch(ctx.dn, cow._fk_parent_version_check(
        ctx.ch, fk.conname, fk.msg, fk.refcols, fk.child_schema, fk.child,
        cow._sexists(ctx.rel, cow._eq(fk.refcols, 'z', 'NEW'), fk.refcols),
        cow._sexists(fk.conrelid, cow._eq2(fk.cols, 'z', fk.refcols, 'NEW'), fk.cols), ctx.row_version), false);
    ctx.dq_stmt := ctx.dq_stmt || cow._defer_branch(ctx.dn, cow._fk_parent_check(ctx.ch, fk.conname, fk.msg,
                                                                                 fk.refcols, fk.child_schema, fk.child,
                                                                                 gone, referenced, 'c._cow_seq > _mark'),
                                                    true);
    ctx.dtrg := cow._defer_trigger(ctx.dtrg, fk.conname, fk.condeferred, 'NEW._cow_deleted', ctx.dn);
    RETURN ctx;
END $gen$;

-- ON DELETE of FOREIGN KEY fk's referenced row: RESTRICT (and any action of a child outside the layer) a
-- refusal at once (par_del_check); NO ACTION at the end of the statement (cow._fk_no_action); CASCADE,
-- SET NULL and SET DEFAULT on the child's overlay view (par_del_act).
CREATE OR REPLACE FUNCTION cow._fk_parent_delete(ctx cow.trigger_context, fk record) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    IF fk.confdeltype = 'r' OR NOT fk.child_cow THEN
        ctx.par_del_check := ctx.par_del_check || format(E'    IF %s THEN\n        %s\n    END IF;\n',
            format('EXISTS (SELECT 1 FROM %s z WHERE %s)', fk.target, cow._eq2(fk.cols, 'z', fk.refcols, 'OLD')),
            cow._fk_parent_raise(fk, 'd'));
    ELSIF fk.confdeltype = 'c' THEN
        ctx.par_del_act := ctx.par_del_act || format(E'    DELETE FROM %s z WHERE %s;\n', fk.target,
                                                     cow._eq2(fk.cols, 'z', fk.refcols, 'OLD'));
    ELSIF fk.confdeltype <> 'a' THEN
        ctx.par_del_act := ctx.par_del_act || format(E'    UPDATE %s z SET %s WHERE %s;\n', fk.target,
            (SELECT string_agg(format('%I = %s', c, CASE WHEN fk.confdeltype = 'n' THEN 'NULL' ELSE 'DEFAULT' END), ', ')
             FROM unnest(coalesce(fk.delsetcols, fk.cols)) AS c),
            cow._eq2(fk.cols, 'z', fk.refcols, 'OLD')) || cow._fk_default_kept(fk, 'd');
    END IF;
    RETURN ctx;
END $gen$;

-- After SET DEFAULT, a child whose defaults are the key just deleted or changed (p_action 'd' or 'u') still
-- references it: PostgreSQL refuses that (its RI_FKey_setdefault looks again), and the child's own check
-- would not, since its key did not change. Other actions: nothing.
CREATE OR REPLACE FUNCTION cow._fk_default_kept(fk record, p_action "char") RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    action "char" := CASE p_action WHEN 'd' THEN fk.confdeltype ELSE fk.confupdtype END;
BEGIN
    IF action <> 'd' THEN
        RETURN '';
    END IF;
    RETURN format(E'    IF EXISTS (SELECT 1 FROM %s z WHERE %s) THEN\n        %s\n    END IF;\n', fk.target,
                  cow._eq2(fk.cols, 'z', fk.refcols, 'OLD'), cow._fk_parent_raise(fk, p_action));
END $gen$;

-- ON UPDATE of FOREIGN KEY fk's referenced key: RESTRICT and NO ACTION (and any action of a child outside the
-- layer) a refusal when the key changes (par_upd_check; a NO ACTION key that moves with the primary key
-- leaves a tombstone, checked at the end: cow._fk_no_action); CASCADE, SET NULL and SET DEFAULT on the
-- child's overlay view (par_upd_act). (Nested IFs: the query runs only when the referenced key changes.)
CREATE OR REPLACE FUNCTION cow._fk_parent_update(ctx cow.trigger_context, fk record) RETURNS cow.trigger_context
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    IF fk.confupdtype IN ('r', 'a') OR NOT fk.child_cow THEN
        ctx.par_upd_check := ctx.par_upd_check || cow._fill($t$    IF {{changed}}{{unmoved}} THEN
        IF {{referenced}} THEN
            {{raise}}
        END IF;
    END IF;
$t$, jsonb_build_object(
            'changed', cow._changed(fk.refcols),
            'unmoved', CASE WHEN fk.confupdtype = 'a' AND fk.child_cow THEN format(' AND NOT %s', cow._changed(ctx.pk))
                            ELSE '' END,
            'referenced', format('EXISTS (SELECT 1 FROM %s z WHERE %s)', fk.target,
                                 cow._eq2(fk.cols, 'z', fk.refcols, 'OLD')),
            'raise', cow._fk_parent_raise(fk, 'u')));
    ELSE
        ctx.par_upd_act := ctx.par_upd_act || cow._fill($t$    IF {{changed}} THEN
        UPDATE {{child}} z SET {{assignments}} WHERE {{referencing}};
{{kept}}    END IF;
$t$, jsonb_build_object(
            'kept', cow._fk_default_kept(fk, 'u'),
            'changed', cow._changed(fk.refcols),
            'child', fk.target,
            'assignments', (SELECT string_agg(format('%I = %s', fk.cols[j],
                                                     CASE fk.confupdtype WHEN 'n' THEN 'NULL' WHEN 'd' THEN 'DEFAULT'
                                                          ELSE format('NEW.%I', fk.refcols[j]) END), ', ')
                            FROM generate_subscripts(fk.cols, 1) AS j),
            'referencing', cow._eq2(fk.cols, 'z', fk.refcols, 'OLD')));
    END IF;
    RETURN ctx;
END $gen$;

-- The objects of registry entry p_id written from its context: the INSTEAD OF triggers (keyed or keyless),
-- the constraint triggers of deferrable constraints on the changes table, and the statement-level FOREIGN KEY
-- triggers (the keyed ones' checks use three more variables); then the signature they were made for.
CREATE OR REPLACE FUNCTION cow._gen_triggers(p_id int, ctx cow.trigger_context) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
BEGIN
    PERFORM cow._gen_insert(ctx);
    IF ctx.keyless THEN
        PERFORM cow._kl_gen_update(ctx);
        PERFORM cow._kl_gen_delete(ctx);
    ELSE
        PERFORM cow._gen_update(ctx);
        PERFORM cow._gen_delete(ctx);
    END IF;
    PERFORM cow._defer_triggers(p_id, ctx.dtrg, ctx.dq);
    PERFORM cow._fk_statement_triggers(p_id, ctx.fk_checks, ctx.dq_stmt,
                                       CASE WHEN ctx.keyless THEN ''
                                            ELSE E'    _r record;\n    _cow_k record;\n    _cow_c record;\n' END);
    UPDATE cow.registry SET signature = cow._signature(ctx.rel) WHERE id = p_id;
END $gen$;

-- The INSTEAD OF, statement and constraint triggers of registry entry p_id, keyed or keyless (the changes
-- table gets the lookup indexes of its unique checks first, cow._build_lookup_indexes). A keyless table
-- (35_keyless.sql) has no key checks and is never a FOREIGN KEY's parent (that takes a unique index); its
-- INSERT records an added row value after the checks the keyed path makes for non-key constraints, a DELETE
-- removes one instance of OLD (the trigger fires once per matched view row, so two identical matched rows
-- remove two instances), an UPDATE removes one instance of OLD and adds NEW, after the same checks.
CREATE OR REPLACE FUNCTION cow._build_triggers(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    ctx cow.trigger_context;
BEGIN
    PERFORM cow._build_lookup_indexes(p_id);
    ctx := cow._trigger_context(p_id);
    IF NOT ctx.keyless THEN
        ctx := cow._key_checks(ctx);
    END IF;
    ctx := cow._fk_child_checks(ctx);
    IF NOT ctx.keyless THEN
        ctx := cow._fk_parent_checks(ctx);
    END IF;
    PERFORM cow._gen_triggers(p_id, ctx);
END $gen$;
