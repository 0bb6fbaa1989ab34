-- cowproxy copy-on-write layer, version 54: the ids' CHECKs of cow.sessions, cow.bindings and
-- cow.proxy_routes in the form migration 51 gave cow.reads: '+' and a length test instead of the bounded
-- repetition '{1,128}', which PostgreSQL's regex engine unrolls (~7.5 µs per value on PostgreSQL 15 against
-- ~0.3 µs, and a compilation in every new backend: a bind writes cow.bindings once per tagged connection).
-- The ids accepted are the same: 1 to 128 characters of [A-Za-z0-9._:-].
ALTER TABLE cow.sessions
    DROP CONSTRAINT IF EXISTS sessions_session_id_check,
    ADD CONSTRAINT sessions_session_id_check
        CHECK (session_id ~ '^[A-Za-z0-9._:-]+$' AND length(session_id) <= 128);
ALTER TABLE cow.bindings
    DROP CONSTRAINT IF EXISTS bindings_session_check,
    ADD CONSTRAINT bindings_session_check CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128);
ALTER TABLE cow.proxy_routes
    DROP CONSTRAINT IF EXISTS proxy_routes_session_check,
    ADD CONSTRAINT proxy_routes_session_check
        CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128);
