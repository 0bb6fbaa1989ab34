-- Row locks in a session (docs/layer.md, "Row locks in a session").
--
-- An overlay view's rows come from a UNION ALL, for which PostgreSQL takes no row lock: `SELECT ... FOR UPDATE`
-- through the view locked nothing. The proxy rewrites a locking SELECT of CoW tables in a session so that every
-- row it returns goes through cow.lock_row or cow.lock_rows (docs/rewrites.md, "Row locks"), which take
-- transaction-level advisory locks keyed by (session, table, key): connections of one session then wait for,
-- fail on (55P03) or skip (SKIP LOCKED) each other's rows as on the plain table, other sessions' keys differ,
-- and untagged traffic takes none. Two keys per row give PostgreSQL's four strengths their conflict table with the two
-- advisory modes:
--
--   strength        key A      key B       conflicts with
--   KEY SHARE       shared     -           UPDATE
--   SHARE           shared     shared      NO KEY UPDATE, UPDATE
--   NO KEY UPDATE   shared     exclusive   SHARE, NO KEY UPDATE, UPDATE
--   UPDATE          exclusive  exclusive   all
--
-- (B is taken before A by every strength, so the two keys of a row never deadlock against each other.) The
-- keys are the two-int4 form of the advisory lock space, which `pg_advisory_lock(bigint)` of applications
-- does not share: 64 bits of hashtextextended of "session/changes table/key as jsonb".

-- One expression, no FROM: the planner inlines it into the caller's expression (every generated UPDATE and
-- DELETE trigger computes a key per row while row locks are in use). With the hash in a sub-select it could
-- not, and each call ran through the SQL function executor, which parsed and planned the body anew: ~190 us
-- per write, the largest single cost of a TPC-B transaction in a session (docs/benchmarks.md, "The layer's
-- own cost in a session"). A body (RETURN) parsed once, at CREATE. The row's 64 bits: cow._row_lock_key
-- splits them into the two int4 keys; the generated triggers split a variable holding them, so that the hash
-- is computed once.
CREATE OR REPLACE FUNCTION cow._row_lock_hash(p_session text, p_table text, p_key jsonb, p_seed int)
RETURNS int8 LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_catalog.hashtextextended(p_session || '/' || p_table || '/' || p_key::text, p_seed);

-- (The hash twice: tens of ns, and the whole stays one inlined expression.)
CREATE OR REPLACE FUNCTION cow._row_lock_key(p_session text, p_table text, p_key jsonb, p_seed int)
RETURNS int[] LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ARRAY[(cow._row_lock_hash(p_session, p_table, p_key, p_seed) >> 32)::int,
             ((cow._row_lock_hash(p_session, p_table, p_key, p_seed) & 4294967295) - 2147483648)::int];

-- The two keys of one row in strength `p_strength` (1 KEY SHARE .. 4 UPDATE) under wait policy `p_policy`
-- (0 wait, 1 SKIP LOCKED, 2 NOWAIT: pglast's LockClauseStrength and LockWaitPolicy): 0 skipped, 1 locked at
-- once, 2 locked after a wait; NOWAIT raises PostgreSQL's 55P03.
CREATE OR REPLACE FUNCTION cow._lock_one(p_session text, p_table text, p_strength int, p_policy int, p_key jsonb)
RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    waited boolean := false;
    k int[];
    exclusive boolean;
BEGIN
    -- Writers wait for row locks only once some were taken in the database (cow._row_lock_wait_code): the
    -- counter moves before the first lock, so a writer that finds it unset finds no lock held. Not in a
    -- read-only transaction (nextval is refused there; a standby has no writers): its lock is still taken,
    -- as before, and a writer that does not wait for it meets what PostgreSQL gives, which refuses FOR
    -- UPDATE in a read-only transaction, so that no writer waits for one.
    IF pg_catalog.pg_sequence_last_value('cow.row_locks'::pg_catalog.regclass) IS NULL
       AND pg_catalog.current_setting('transaction_read_only') = 'off' THEN
        PERFORM pg_catalog.nextval('cow.row_locks'::pg_catalog.regclass);
    END IF;
    FOR seed IN 1..2 LOOP
        CONTINUE WHEN seed = 1 AND p_strength < 2;  -- KEY SHARE takes key A only
        k := cow._row_lock_key(p_session, p_table, p_key, 3 - seed);  -- key B (seed 2) first, then A
        exclusive := CASE WHEN seed = 1 THEN p_strength >= 3 ELSE p_strength = 4 END;
        CONTINUE WHEN CASE WHEN exclusive THEN pg_catalog.pg_try_advisory_xact_lock(k[1], k[2])
                           ELSE pg_catalog.pg_try_advisory_xact_lock_shared(k[1], k[2]) END;
        IF p_policy = 1 THEN
            RETURN 0;
        ELSIF p_policy = 2 THEN
            RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE = format('could not obtain lock on row in relation "%s"',
                (SELECT g.table_name FROM cow.registry g WHERE g.changes_table = p_table));
        ELSIF exclusive THEN
            PERFORM pg_catalog.pg_advisory_xact_lock(k[1], k[2]);
        ELSE
            PERFORM pg_catalog.pg_advisory_xact_lock_shared(k[1], k[2]);
        END IF;
        waited := true;
    END LOOP;
    RETURN CASE WHEN waited THEN 2 ELSE 1 END;
END $$;

-- One CoW table in the FROM (the common case: `Model.objects.select_for_update().get(...)`): the row `p_row`
-- (the view's row type) once locked, or after a wait its version now current in the session (the function is
-- VOLATILE: in READ COMMITTED each of its statements sees what committed meanwhile), as PostgreSQL's
-- EvalPlanQual returns the new version; no row when SKIP LOCKED skips it or the lock holder deleted it. The
-- proxy checks the statement's WHERE again on what this returns. A set-returning function in the select list
-- runs after ORDER BY and before LIMIT, so, as PostgreSQL's LockRows, only the rows a LIMIT passes are locked,
-- and SKIP LOCKED takes the next row instead of a skipped one.
CREATE OR REPLACE FUNCTION cow.lock_row(p_row anyelement, p_table text, p_strength int, p_policy int, p_key jsonb)
RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
DECLARE
    s text := cow._session();  -- the bound session, else cow.session_id (11_binding.sql)
    got int;
    now jsonb;
BEGIN
    got := CASE WHEN s IS NULL THEN 1 ELSE cow._lock_one(s, p_table, p_strength, p_policy, p_key) END;
    IF got = 1 THEN
        RETURN NEXT p_row;
    ELSIF got = 2 THEN
        now := cow._row_now(p_table, p_key);
        IF now IS NOT NULL THEN
            RETURN NEXT pg_catalog.jsonb_populate_record(p_row, now);
        END IF;
    END IF;
END $$;

-- Several locked tables (a join): the row `p_value` (one of the statement's output columns) once each of
-- `p_rows` is locked, one element per locked table `[changes table, strength, policy, key values, row]`. After
-- a wait each row is read again: gone, the output row is skipped as PostgreSQL skips a row deleted under its
-- lock; changed, 40001, as the layer's writes do (the statement's other columns were read before the wait;
-- PostgreSQL would return the new version).
CREATE OR REPLACE FUNCTION cow.lock_rows(p_value anyelement, VARIADIC p_rows jsonb[])
RETURNS SETOF anyelement LANGUAGE plpgsql AS $$
DECLARE
    s text := cow._session();  -- the bound session, else cow.session_id (11_binding.sql)
    r jsonb;
    waited boolean := false;
    got int;
    fresh jsonb;
BEGIN
    IF s IS NOT NULL THEN
        FOREACH r IN ARRAY p_rows LOOP
            got := cow._lock_one(s, r->>0, (r->>1)::int, (r->>2)::int, r->3);
            IF got = 0 THEN
                RETURN;
            END IF;
            waited := waited OR got = 2;
        END LOOP;
    END IF;
    IF waited THEN
        FOREACH r IN ARRAY p_rows LOOP
            fresh := cow._row_now(r->>0, r->3);
            IF fresh IS NULL THEN
                RETURN;
            END IF;
            IF fresh IS DISTINCT FROM r->4 THEN
                RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'could not serialize access due to concurrent update',
                    DETAIL = format('Another transaction of session "%s" changed a row of "%s" while this statement waited for its lock.',
                                    s, (SELECT g.table_name FROM cow.registry g WHERE g.changes_table = r->>0)),
                    HINT = cow._row_changed_hint();
            END IF;
        END LOOP;
    END IF;
    RETURN NEXT p_value;
END $$;

-- The session's current version of one key of a table (by its changes table) as jsonb, read with a new
-- snapshot; NULL when there is none.
CREATE OR REPLACE FUNCTION cow._row_now(p_table text, p_key jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    g record;
    fresh jsonb;
BEGIN
    SELECT x.overlay_schema, x.table_name, x.pk_columns INTO g FROM cow.registry x WHERE x.changes_table = p_table;
    EXECUTE format('SELECT pg_catalog.to_jsonb(v) FROM %I.%I v WHERE (%s) = (SELECT %s FROM pg_catalog.jsonb_populate_record(NULL::%I.%I, $1) k)',
                   g.overlay_schema, g.table_name,
                   (SELECT string_agg(format('v.%I', c), ', ' ORDER BY i) FROM unnest(g.pk_columns) WITH ORDINALITY AS u(c, i)),
                   (SELECT string_agg(format('k.%I', c), ', ' ORDER BY i) FROM unnest(g.pk_columns) WITH ORDINALITY AS u(c, i)),
                   g.overlay_schema, g.table_name)
        INTO fresh
        USING (SELECT pg_catalog.jsonb_object_agg(c, p_key->(i::int - 1)) FROM unnest(g.pk_columns) WITH ORDINALITY AS u(c, i));
    RETURN fresh;
END $$;

-- What an UPDATE or DELETE in a session does about those locks, as plpgsql code for the generated triggers
-- (one row `var`): wait until no other transaction of the session holds a lock the write conflicts with, as
-- PostgreSQL's UPDATE waits for FOR SHARE/UPDATE holders. An UPDATE that keeps the key conflicts like NO KEY
-- UPDATE (key B), a DELETE or a key change (`strong`) like UPDATE (key A). The lock is taken at session level
-- and released at once, so a bulk write holds no lock table entries; nor does it hold the lock: a later FOR
-- UPDATE of another transaction does not wait for this write (docs/layer.md). Inline, not a function call:
-- ~2.6 us per row against ~7 (100k rows in a plpgsql loop on 15).
-- Only once row locks were ever taken in the database (cow._lock_one moves cow.row_locks before its first
-- lock; sequences are not transactional, so every backend sees it at once): until then no lock can be held,
-- and the answer the lock would give is known. The wait, with its key's hash and the first use of each of its
-- expressions in a transaction, was ~54,000 of the ~624,000 instructions of an autocommit UPDATE on 15
-- (docs/benchmarks.md, "The layer's write path at rest"); the counter's read is one buffer hit.
CREATE OR REPLACE FUNCTION cow._row_lock_wait_code(p_table text, pk text[], var text, strong text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(E'    IF pg_catalog.pg_sequence_last_value(\'cow.row_locks\'::pg_catalog.regclass) IS NOT NULL THEN\n'
                   '    DECLARE\n'
                   '        _lh int8 := cow._row_lock_hash(_s, %L, pg_catalog.jsonb_build_array(%s), %s);\n'
                   '    BEGIN\n'
                   '        PERFORM pg_catalog.pg_advisory_lock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);\n'
                   '        PERFORM pg_catalog.pg_advisory_unlock((_lh >> 32)::int, ((_lh & 4294967295) - 2147483648)::int);\n'
                   '    END;\n'
                   '    END IF;\n',
                  p_table, cow._collist(pk, var || '.'),
                  CASE WHEN strong = 'true' THEN '1' ELSE format('CASE WHEN %s THEN 1 ELSE 2 END', strong) END)
$$;
