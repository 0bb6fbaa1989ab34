-- cowproxy copy-on-write layer, migration 3: reads in a session.
-- cow._build_view as in 0001, plus autovacuum settings for the changes tables (install runs cow.refresh(true)
-- after the migrations, which rebuilds every table and so applies them to existing changes tables).
-- The overlay view's SQL is unchanged: the shapes measured against it (docs/layer.md, "Performance") were not
-- faster overall.

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

