-- cowproxy copy-on-write layer: row-level security in a session.
-- A repeatable file (docs/layer.md, "Migrations"; the shape: docs/layer.md, "Row-level security in a session").
--
-- A table with row-level security enabled (relrowsecurity) gets, after the generators have run (cow.refresh
-- calls cow._rls_sync at its end):
-- - an overlay view with security_invoker = true, so that PostgreSQL applies the table's own policies to its
--   base rows for the current role and settings, with FORCE ROW LEVEL SECURITY, BYPASSRLS and the owner's
--   exemption as on the plain table; the session's own rows (the changes leaf) are filtered by the table's
--   SELECT policies re-stated for the current role (cow._rls_cond), behind the same exemption
--   (row_security_active of the table); the view keeps the generated shape otherwise (two plain leaves
--   under one anti join, "Overlay view shape"), so its plans keep their index paths;
-- - an INSTEAD OF row trigger cow_0rls, which fires before the generated cow_insert/cow_update/cow_delete
--   (triggers fire in name order; a NULL from one skips the row): UPDATE and DELETE skip rows their USING
--   policies hide, INSERT and UPDATE raise 42501 with PostgreSQL's message when the new row fails WITH CHECK;
--   an INSERT with RETURNING also when the new row fails the SELECT policies (PostgreSQL's rule: the role may
--   not be shown a row it cannot see). A trigger cannot see RETURNING, so the proxy marks such a statement:
--   it sends it with the comment /*cow_returning*/ first, which the trigger finds in current_query() (the
--   statement's whole text, as the client's statement is: no GUC could be set for one statement only). A
--   client writing that comment itself only gets the stricter check.
-- Tables without row-level security keep the generated view and triggers unchanged (nothing here runs for
-- them but the check that there is nothing to do).

-- Whether the current role is one of p_roles (PUBLIC: 0), as PostgreSQL's has_privs_of_role: SQL text, an
-- InitPlan (evaluated once per statement, not per row).
CREATE OR REPLACE FUNCTION cow._rls_roles(p_roles oid[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN 0::oid = ANY (p_roles) THEN 'true'
                ELSE '(SELECT ' || string_agg(format('pg_catalog.pg_has_role(%s::oid, %L)', r, 'USAGE'), ' OR '
                                              ORDER BY r) || ')' END
    FROM unnest(p_roles) AS r
$$;

-- The policies of table p_rel for command p_cmd (pg_policy.polcmd: r, a, w, d; ALL policies count for each),
-- in name order (PostgreSQL's), with their expression: USING, or with p_check the expression a new row must
-- pass (WITH CHECK, else USING: PostgreSQL's rule). Expressions as pg_get_expr shows them with search_path
-- pg_catalog (names of other schemas qualified), over the table's column names.
CREATE OR REPLACE FUNCTION cow._rls_policies(p_rel oid, p_cmd "char", p_check boolean)
RETURNS TABLE (name text, permissive boolean, roles text, expr text)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT p.polname::text, p.polpermissive, cow._rls_roles(p.polroles),
           pg_get_expr(CASE WHEN p_check THEN coalesce(p.polwithcheck, p.polqual) ELSE p.polqual END, p.polrelid)
    FROM pg_policy p
    WHERE p.polrelid = p_rel AND p.polcmd IN (p_cmd, '*')
      AND (CASE WHEN p_check THEN coalesce(p.polwithcheck, p.polqual) ELSE p.polqual END) IS NOT NULL
    ORDER BY p.polname
$$;

-- The permissive part of the condition: any permissive policy of the current role passes (none: false). A
-- policy of another role is not evaluated at all (CASE: its expression may fail for this role, e.g. a cast of
-- a claim another role's requests never set), as PostgreSQL leaves it out.
CREATE OR REPLACE FUNCTION cow._rls_permissive(p_rel oid, p_cmd "char", p_check boolean) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '(' || coalesce(string_agg(format('CASE WHEN %s THEN (%s) END', roles, expr), ' OR ' ORDER BY name),
                           'false') || ')'
    FROM cow._rls_policies(p_rel, p_cmd, p_check) WHERE permissive
$$;

-- A restrictive policy's part: passes, or is not the current role's.
CREATE OR REPLACE FUNCTION cow._rls_restrictive(roles text, expr text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT format('CASE WHEN %s THEN (%s) ELSE true END', roles, expr) $$;

-- The whole condition for p_cmd, as PostgreSQL combines policies: any permissive AND every restrictive one.
CREATE OR REPLACE FUNCTION cow._rls_cond(p_rel oid, p_cmd "char", p_check boolean) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT cow._rls_permissive(p_rel, p_cmd, p_check)
           || coalesce((SELECT string_agg(' AND ' || cow._rls_restrictive(roles, expr), '' ORDER BY name)
                        FROM cow._rls_policies(p_rel, p_cmd, p_check) WHERE NOT permissive), '')
$$;

-- What decides whether the overlay needs rebuilding: row security on or forced, and every policy.
CREATE OR REPLACE FUNCTION cow._rls_signature(p_rel oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT md5(concat_ws('|', 'returning', c.relrowsecurity, c.relforcerowsecurity,
                         (SELECT string_agg(concat_ws(':', p.polname, p.polcmd, p.polpermissive, p.polroles::text,
                                                      pg_get_expr(p.polqual, p.polrelid),
                                                      pg_get_expr(p.polwithcheck, p.polrelid)), ',' ORDER BY p.polname)
                          FROM pg_policy p WHERE p.polrelid = c.oid)))
    FROM pg_class c WHERE c.oid = p_rel
$$;

-- The code that raises 42501 unless the new row `var` passes p_cmd's checks (in PostgreSQL's order: the
-- permissive policies together, then each restrictive one, whose name the message gives), over row source
-- `src` aliased as the table.
CREATE OR REPLACE FUNCTION cow._rls_check_code(p_rel oid, p_cmd "char", p_force_using boolean, src text, tab text)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format(E'        IF NOT coalesce((SELECT %s FROM (%s) AS %I), false) THEN\n'
                  '            RAISE EXCEPTION USING ERRCODE = ''42501'', MESSAGE = %L;\n        END IF;\n',
                  cow._rls_permissive(p_rel, p_cmd, NOT p_force_using), src, tab,
                  format('new row violates row-level security policy for table "%s"', tab))
        || coalesce((SELECT string_agg(format(
                  E'        IF NOT coalesce((SELECT %s FROM (%s) AS %I), false) THEN\n'
                  '            RAISE EXCEPTION USING ERRCODE = ''42501'', MESSAGE = %L;\n        END IF;\n',
                  cow._rls_restrictive(roles, expr), src, tab,
                  format('new row violates row-level security policy "%s" for table "%s"', name, tab)), '' ORDER BY name)
                     FROM cow._rls_policies(p_rel, p_cmd, NOT p_force_using) WHERE NOT permissive), '')
$$;

-- The overlay view of a keyed table with row-level security: the generated shape (30_generators.sql,
-- cow._build_view), security_invoker, the merged subquery aliased as the table (policy expressions may name
-- the table's columns through it) and the changes leaf filtered by the SELECT policies.
CREATE OR REPLACE FUNCTION cow._rls_view(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    sch text;
    tab text;
    t text;
    sess text := $$pg_catalog.current_setting('cow.session_id', true)$$;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    SELECT n.nspname, c.relname INTO sch, tab FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = r.relid;
    t := quote_ident(tab);
    EXECUTE format(
        'CREATE OR REPLACE VIEW %1$s WITH (security_invoker = true) AS SELECT %2$s FROM ('
        'SELECT 1 AS _cow_k, %3$s, coalesce(%7$s, '''') AS _cow_s, NULL::boolean AS _cow_cur, '
        'NULL::boolean AS _cow_del, true AS _cow_b FROM %4$s b '
        'UNION ALL SELECT 2, %5$s, c._cow_session, c._cow_current, c._cow_deleted, NULL FROM %6$s c) %9$s '
        'WHERE %12$s AND %9$s._cow_s = coalesce(%7$s, '''') AND CASE %9$s._cow_k WHEN 1 THEN true '
        'ELSE %7$s <> '''' AND %9$s._cow_cur AND NOT %9$s._cow_del '
        'AND ((SELECT NOT pg_catalog.row_security_active(%10$s::oid)) OR %11$s) END '
        'AND NOT EXISTS (SELECT 1 FROM %6$s x WHERE x._cow_session = %7$s AND x._cow_current '
        'AND (x.%13$I IS NOT NULL) = %9$s._cow_b AND %8$s)',
        format('%I.%I', r.overlay_schema, tab), cow._collist(r.col_names, t || '.'),
        cow._collist(r.col_names, 'b.'), format('%I.%I', sch, tab), cow._collist(r.col_names, 'c.'),
        format('cow_changes.%I', r.changes_table), sess, cow._eq(r.pk_columns, 'x', t), t, r.relid,
        cow._rls_cond(r.relid, 'r', false), cow._read_gate_sql(), r.pk_columns[1]);
END $gen$;

-- The INSTEAD OF trigger cow_0rls of registry entry p_id's overlay view (see the top of this file).
CREATE OR REPLACE FUNCTION cow._rls_trigger(p_id int) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    r cow.registry%ROWTYPE;
    tab text;
    fn text;
BEGIN
    SELECT * INTO STRICT r FROM cow.registry WHERE id = p_id;
    SELECT c.relname INTO tab FROM pg_class c WHERE c.oid = r.relid;
    fn := format('cow_changes.%I', r.changes_table || '_rls');
    EXECUTE format(
        E'CREATE OR REPLACE FUNCTION %1$s() RETURNS trigger LANGUAGE plpgsql AS $body$\n'
        'BEGIN\n'
        '    IF NOT pg_catalog.row_security_active(%2$s::oid) THEN\n'
        '        IF TG_OP = ''DELETE'' THEN RETURN OLD; END IF;\n'
        '        RETURN NEW;\n'
        '    END IF;\n'
        '    IF TG_OP = ''INSERT'' THEN\n%3$s'
        '        IF pg_catalog.strpos(pg_catalog.current_query(), ''/*cow_returning*/'') > 0 THEN\n%10$s'
        '        END IF;\n'
        '        RETURN NEW;\n'
        '    ELSIF TG_OP = ''UPDATE'' THEN\n'
        '        IF NOT coalesce((SELECT %4$s FROM (%5$s) AS %6$I), false) THEN\n'
        '            RETURN NULL;\n'
        '        END IF;\n%7$s%8$s'
        '        RETURN NEW;\n'
        '    END IF;\n'
        '    IF NOT coalesce((SELECT %9$s FROM (%5$s) AS %6$I), false) THEN\n'
        '        RETURN NULL;\n'
        '    END IF;\n'
        '    RETURN OLD;\n'
        'END $body$',
        fn, r.relid,
        cow._rls_check_code(r.relid, 'a', false, cow._rowsrc(r.col_names, 'NEW'), tab),
        cow._rls_cond(r.relid, 'w', false), cow._rowsrc(r.col_names, 'OLD'), tab,
        cow._rls_check_code(r.relid, 'w', false, cow._rowsrc(r.col_names, 'NEW'), tab),
        -- an UPDATE's new row must also pass the SELECT policies (PostgreSQL: when the UPDATE reads columns)
        cow._rls_check_code(r.relid, 'r', true, cow._rowsrc(r.col_names, 'NEW'), tab),
        cow._rls_cond(r.relid, 'd', false),
        -- INSERT ... RETURNING: the new row must pass the SELECT policies too
        cow._rls_check_code(r.relid, 'r', true, cow._rowsrc(r.col_names, 'NEW'), tab));
    EXECUTE format('COMMENT ON FUNCTION %s() IS %L', fn, cow._rls_signature(r.relid));
    EXECUTE format('CREATE OR REPLACE TRIGGER cow_0rls INSTEAD OF INSERT OR UPDATE OR DELETE ON %I.%I '
                   'FOR EACH ROW EXECUTE FUNCTION %s()', r.overlay_schema, tab, fn);
END $gen$;

-- Brings every table's overlay in step with its row-level security (called at the end of cow.refresh):
-- tables with it get the view and trigger above when they lack them or their policies changed; tables
-- without it lose the trigger (their view is the generated one again after any rebuild). p_ids: the registry
-- entries to bring in step (NULL: all; cow._refresh_tables passes those it built).
CREATE OR REPLACE FUNCTION cow._rls_sync(p_ids int[] DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $gen$
DECLARE
    x record;
BEGIN
    FOR x IN SELECT g.id, g.relid, g.pk_columns, g.changes_table, c.relrowsecurity AS rls,
                    to_regprocedure(format('cow_changes.%I()', g.changes_table || '_rls')) AS fn,
                    v.oid AS view, coalesce('security_invoker=true' = ANY (v.reloptions), false) AS invoker
             FROM cow.registry g
             JOIN pg_class c ON c.oid = g.relid
             LEFT JOIN pg_namespace vn ON vn.nspname = g.overlay_schema
             LEFT JOIN pg_class v ON v.relnamespace = vn.oid AND v.relname = c.relname AND v.relkind = 'v'
             WHERE p_ids IS NULL OR g.id = ANY (p_ids)
             ORDER BY g.id LOOP
        IF x.rls AND x.view IS NOT NULL THEN
            IF NOT x.invoker OR x.fn IS NULL
               OR obj_description(x.fn, 'pg_proc') IS DISTINCT FROM cow._rls_signature(x.relid)
               OR NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = x.view AND tgname = 'cow_0rls') THEN
                IF x.pk_columns = '{}' THEN
                    -- A table without a key: its base rows get the table's policies; its added rows are not
                    -- filtered (docs/layer.md, "Row-level security in a session").
                    EXECUTE format('ALTER VIEW %s SET (security_invoker = true)', x.view::regclass);
                ELSE
                    PERFORM cow._rls_view(x.id);
                END IF;
                PERFORM cow._rls_trigger(x.id);
            END IF;
        ELSIF NOT x.rls AND x.fn IS NOT NULL THEN
            -- Row security off: the generated view and triggers again.
            EXECUTE format('DROP FUNCTION %s CASCADE', x.fn::regprocedure);
            IF x.pk_columns = '{}' THEN
                PERFORM cow._kl_build_view(x.id);
            ELSE
                PERFORM cow._build_view(x.id);
            END IF;
            PERFORM cow._build_triggers(x.id);
        END IF;
    END LOOP;
END $gen$;
