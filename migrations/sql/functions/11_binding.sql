-- cowproxy copy-on-write layer: the binding of a backend to its session (docs/threat-model.md).
-- A repeatable file (docs/layer.md, "Migrations"); it comes after 10_core.sql and before every file whose
-- SQL-language functions or generated objects call cow._session().
--
-- The GUC cow.session_id says which session a connection reads and writes, but any SQL on the connection can
-- change it (SET, RESET, set_config in a function, DISCARD ALL). A backend *bound* by cow.bind_session, which
-- only a caller knowing the binding secret can call with effect (the proxy), is recorded in cow.bindings
-- (migration 0020), which only the layer's owner can write. Then:
-- - writes (the generated triggers, cow._write_session) go to the bound session whatever the GUC says;
-- - the overlay views refuse to read (42501) while the GUC names another session (cow._read_gate);
-- - the base tables' guard refuses writes whatever the GUC says;
-- - layer management refuses to run (cow._refuse_bound).
-- An unbound backend trusts the GUC as before: the no-proxy path of a trusted client (cow.use_session).

-- This backend's binding row, for every role: a security-barrier view owned by the layer's owner that shows
-- the row of the calling backend's pid only (none for a backend that is not bound). Its token is no secret:
-- it only saves reading the backend's start time, and a backend can only ever see its own pid's row (a row
-- an ended backend left under a reused pid gives it a session it could join with cow.use_session anyway).
-- Reading it costs an index probe, no function call: the overlay views' gate and cow._bound() use it.
CREATE OR REPLACE VIEW cow.my_binding WITH (security_barrier) AS
    SELECT x.session, x.token, x.backend_start FROM cow.bindings x WHERE x.pid = pg_catalog.pg_backend_pid();
GRANT SELECT ON cow.my_binding TO PUBLIC;

-- The overlay views' gate reads this (cow._read_gate_sql): a row when this backend is bound to a session
-- other than the GUC's (or the row is an ended backend's under this pid). It has no columns, so it needs no
-- security barrier: a caller's condition on it sees no value of any row, and the planner flattens it into
-- the gate (one scan under one InitPlan; my_binding costs a Subquery Scan and a second InitPlan).
CREATE OR REPLACE VIEW cow.my_binding_elsewhere AS
    SELECT FROM cow.bindings x
    WHERE x.pid = pg_catalog.pg_backend_pid()
      AND x.session IS DISTINCT FROM nullif(pg_catalog.current_setting('cow.session_id', true), '');
GRANT SELECT ON cow.my_binding_elsewhere TO PUBLIC;

-- The session this backend is bound to, or NULL. It runs as the caller, with the caller's search_path:
-- every operator and function is schema-qualified, so that no object the caller creates can change its
-- answer. (PARALLEL RESTRICTED: pg_backend_pid() in a parallel worker is the worker's; the leader runs it.)
CREATE OR REPLACE FUNCTION cow._bound() RETURNS text
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED AS $$
DECLARE
    b record;
BEGIN
    IF pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN
        RETURN NULL;  -- (never bound: see cow._session)
    END IF;
    SELECT x.session, x.token, x.backend_start INTO b FROM cow.my_binding x;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The token the bind left in the GUC, else the backend's start time: a row of an ended backend that had
    -- this pid has neither (its token was never in this backend, and a new backend starts later).
    IF b.token OPERATOR(pg_catalog.=) pg_catalog.current_setting('cow._bind_token', true)
       OR b.backend_start OPERATOR(pg_catalog.=) (SELECT a.backend_start FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) a) THEN
        RETURN b.session;
    END IF;
    RETURN NULL;
END $$;

-- The session of this backend's reads and writes: the bound one when bound (the GUC is not consulted), else
-- the GUC cow.session_id (NULL: none). A backend without a temporary schema was never bound: cow._bind makes
-- one in the binding's transaction (both go if it rolls back), and a backend keeps it until it ends, DISCARD
-- included (the guard's WHEN clause, cow._add_guard, relies on the same). There the binding is not looked up:
-- the generated triggers call this once a row, and the lookup is a plpgsql call and an index probe
-- (docs/benchmarks.md, "The layer's first writes and deferred checks", branch i16lay3).
CREATE OR REPLACE FUNCTION cow._session() RETURNS text
LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$
    SELECT coalesce(CASE WHEN pg_catalog.pg_my_temp_schema() OPERATOR(pg_catalog.<>) 0::pg_catalog.oid
                         THEN cow._bound() END,
                    nullif(pg_catalog.current_setting('cow.session_id', true), ''))
$$;

CREATE OR REPLACE FUNCTION cow.current_session() RETURNS text
LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$ SELECT cow._session() $$;

-- The session this backend is bound to (NULL: not bound), for clients and the proxy.
CREATE OR REPLACE FUNCTION cow.bound_session() RETURNS text
LANGUAGE sql STABLE PARALLEL RESTRICTED AS $$ SELECT cow._bound() $$;

-- The overlay views' gate, when the backend has a binding row whose session is not the GUC's
-- (cow._read_gate_sql): true, unless the backend is bound and cow.session_id names another session or none
-- (it was changed by SQL the proxy did not see): then the read is refused rather than served from that
-- session. (The SET clause: these helpers run as the caller, whose search_path must not choose operators.)
CREATE OR REPLACE FUNCTION cow._read_gate() RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b text := cow._bound();
    g text := nullif(pg_catalog.current_setting('cow.session_id', true), '');
BEGIN
    IF b IS NOT NULL AND g IS DISTINCT FROM b THEN
        RAISE EXCEPTION 'cowproxy: this connection is bound to session %, but cow.session_id is now %: reads in another session are refused',
            b, coalesce(quote_literal(g), 'unset')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Set it back with SELECT cow.use_session(%L).', b);
    END IF;
    RETURN true;
END $$;

-- The gate as the overlay views hold it (cow._build_view, cow._kl_build_view, cow._rls_view): a one-time
-- filter on an InitPlan that scans cow.my_binding_elsewhere, calling cow._read_gate only when the backend has
-- a binding row whose session is not the GUC's (then it raises, or finds the row is an ended backend's).
-- Unbound backends and bound ones in their own session pay one scan of a one-page table per view and
-- statement, no function call.
CREATE OR REPLACE FUNCTION cow._read_gate_sql() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '(NOT EXISTS (SELECT FROM cow.my_binding_elsewhere) OR cow._read_gate())'
$$;

-- Layer management (commit, discard, create, refresh, enable, uninstall, the binding secret) runs on an
-- unbound connection only: a bound one is an agent's.
CREATE OR REPLACE FUNCTION cow._refuse_bound(what text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b text := cow._bound();
BEGIN
    IF b IS NOT NULL THEN
        RAISE EXCEPTION 'cowproxy: % refused: this connection is bound to session % (layer management runs on an unbound connection)',
            what, b USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;

-- A bind writes cow.bindings: in a read-only transaction (BEGIN READ ONLY, default_transaction_read_only,
-- a standby) say so in one line (PostgreSQL's own error names the DELETE inside cow._bind), same SQLSTATE.
CREATE OR REPLACE FUNCTION cow._bind_writable(p_session text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'cowproxy: bind_session(%) needs a read-write transaction (it records the binding)',
            coalesce(quote_literal(p_session), 'NULL')
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Bind before BEGIN READ ONLY, or in a read-write transaction: a backend already bound to the session binds again without a write.';
    END IF;
END $$;

-- Record (or, with a NULL session, remove) this backend's binding, once the secret is proven. The GUCs are
-- cow.bind_session's business (a SET clause here would revert the search_path it sets). A bind is the first
-- statement of a new tagged connection, where each statement of a function is parsed and planned for its one
-- run and each operator and function met for the first time is looked up in the catalog: so the backend's
-- row is read only when it may be bound (it has a temporary schema), the token is set in the INSERT's
-- RETURNING, the read-only check calls cow._bind_writable only to raise, and every comparison has operands
-- of one type (an `oid = int` or `float8 < numeric` is resolved by a search of every candidate operator:
-- ~1.5 M instructions each in a new backend; docs/benchmarks.md, "The join in a new backend").
CREATE OR REPLACE FUNCTION cow._bind(p_session text, p_secret text) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    want text;
    proven boolean;
    b_session text;
    b_token text;
    tok text;
    prev text;
    replication text;
    done text;  -- (set_config's result: an assignment is a simple expression, a PERFORM runs the executor)
BEGIN
    SELECT x.hash, x.hash = encode(sha256(convert_to(p_secret, 'UTF8')), 'hex') INTO want, proven
    FROM cow.bind_secret x;
    IF want IS NULL THEN
        RAISE EXCEPTION 'cowproxy: bind_session: no binding secret is set in this database'
            USING ERRCODE = 'invalid_password', HINT = 'Set one with: cowproxy secret --rotate --file PATH';
    END IF;
    IF p_secret IS NULL OR NOT proven THEN
        RAISE EXCEPTION 'cowproxy: bind_session: wrong binding secret' USING ERRCODE = 'invalid_password';
    END IF;
    IF pg_my_temp_schema() <> 0::oid THEN
        -- (Without a temporary schema this backend was never bound, cow._session: a row under its pid is an
        -- ended backend's, which binds no one and which a sweep removes.)
        SELECT y.session, y.token INTO b_session, b_token FROM cow.bindings y WHERE y.pid = pg_backend_pid();
    END IF;
    IF p_session IS NULL THEN
        IF b_session IS NOT NULL THEN
            PERFORM cow._bind_writable(p_session);
            DELETE FROM cow.bindings x WHERE x.pid = pg_backend_pid();
        END IF;
        done := set_config('cow._bind_token', '', false);
        RETURN;
    END IF;
    IF b_session = p_session AND b_token = current_setting('cow._bind_token', true) THEN
        RETURN;  -- bound to it already (an operation switch): no write
    END IF;
    IF current_setting('transaction_read_only') = 'on' THEN
        PERFORM cow._bind_writable(p_session);  -- (raises)
    END IF;
    -- Rows of ended backends go now and then (about one bind in 32; at most one row per pid ever used, and
    -- a row counts for no backend but its own, by pid and start time: they only take room), against a
    -- fresh list of backends (the list is cached per transaction: a stale one would not show a backend that
    -- started and bound since). In a new backend this sweep was ~0.6 ms of every bind.
    IF random() < 0.03125::float8 THEN
        PERFORM pg_stat_clear_snapshot();
        DELETE FROM cow.bindings x WHERE NOT EXISTS (
            SELECT 1 FROM pg_stat_get_activity(NULL) a WHERE a.pid = x.pid AND a.backend_start = x.backend_start);
    END IF;
    INSERT INTO cow.bindings AS x (pid, backend_start, token, session)
    VALUES (pg_backend_pid(), (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a),
            gen_random_uuid()::text, p_session)
    ON CONFLICT (pid) DO UPDATE SET backend_start = excluded.backend_start, token = excluded.token,
                                    session = excluded.session, bound_at = now()
    RETURNING set_config('cow._bind_token', x.token, false) INTO tok;
    IF pg_my_temp_schema() = 0::oid THEN
        -- The guard asks cow._bound() only of backends with a temporary schema (cow._add_guard): make this
        -- one's (it stays until the backend ends; rolled back with this transaction, as the binding is).
        -- A small object that makes it: a domain, no relation or file (a shell type costs less, but only a
        -- superuser may make one). (cow.in_layer: the layer's DDL event triggers leave it alone.) An owner
        -- allowed to set session_replication_role = replica (a superuser) also skips them, and the
        -- application's, which need not see it either: in a new backend their first call compiles their
        -- functions (docs/benchmarks.md, "the bind's cost").
        prev := current_setting('cow.in_layer', true);
        replication := current_setting('session_replication_role');
        done := set_config('cow.in_layer', 'on', true);
        IF replication <> 'replica' THEN
            BEGIN
                done := set_config('session_replication_role', 'replica', true);
            EXCEPTION WHEN insufficient_privilege THEN
                replication := 'replica';  -- (not allowed: nothing to put back)
            END;
        END IF;
        CREATE DOMAIN pg_temp.cow_bind_mark AS pg_catalog.bool;
        DROP DOMAIN pg_temp.cow_bind_mark;
        IF replication <> 'replica' THEN
            done := set_config('session_replication_role', replication, true);
        END IF;
        done := set_config('cow.in_layer', coalesce(prev, ''), true);
    END IF;
END $$;

-- Bind this backend to `session` (and set the GUCs as cow.use_session does), proven by the binding secret;
-- `bind_session(NULL, NULL, secret)` unbinds (a proxy reusing the server connection for another client). The
-- operation may be switched later without the secret (cow.use_operation, SET cow.operation_id): it only
-- relabels writes within the session. A wrong secret: 28P01, and nothing changes.
CREATE OR REPLACE FUNCTION cow.bind_session(session text, operation text, secret text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    session := nullif(session, '');
    operation := nullif(operation, '');
    IF NOT coalesce(cow.valid_id(session), true) OR NOT coalesce(cow.valid_id(operation), true) THEN
        PERFORM cow._check_id(session, 'session');  -- (raises)
        PERFORM cow._check_id(operation, 'operation');
    END IF;
    PERFORM cow._bind(session, secret);
    RETURN cow._join(session, operation);
END $$;

-- Set the binding secret (only its SHA-256 is kept): the layer's owner or a superuser, on an unbound
-- connection (`cowproxy secret --rotate`).
CREATE OR REPLACE FUNCTION cow.set_bind_secret(secret text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cow._refuse_bound('set_bind_secret');
    IF secret IS NULL OR length(secret) < 16 THEN
        RAISE EXCEPTION 'cowproxy: a binding secret has at least 16 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO cow.bind_secret AS x (hash) VALUES (encode(sha256(convert_to(secret, 'UTF8')), 'hex'))
    ON CONFLICT (only_row) DO UPDATE SET hash = excluded.hash, set_at = now();
END $$;
REVOKE ALL ON FUNCTION cow.set_bind_secret(text) FROM PUBLIC;

-- A session's data from a bound connection: its own session only (cow.session_changes, session_diff, ...).
CREATE OR REPLACE FUNCTION cow._refuse_other(what text, session text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b text := cow._bound();
BEGIN
    IF b IS NOT NULL AND session IS DISTINCT FROM b THEN
        RAISE EXCEPTION 'cowproxy: %(%) refused: this connection is bound to session %', what,
            coalesce(quote_literal(session), 'NULL'), b USING ERRCODE = 'insufficient_privilege';
    END IF;
END $$;
