-- cowproxy copy-on-write layer, version 20: the binding of a backend to its session (see
-- docs/threat-model.md). `cow.bind_session(session, operation, secret)` records here which session this
-- backend is bound to, and only a caller that knows the binding secret (its SHA-256 is kept in
-- cow.bind_secret) can make, change or remove the row. The guard, the overlay views and the generated
-- triggers trust this row (cow._session(), functions/11_binding.sql), not the GUC cow.session_id, which any
-- SQL on the connection can change. Both tables are readable and writable by their owner (the installer)
-- only; the layer's SECURITY DEFINER functions read them for everyone else.
CREATE TABLE IF NOT EXISTS cow.bind_secret (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    hash     text NOT NULL,                        -- hex SHA-256 of the secret's UTF-8 bytes
    set_at   timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON cow.bind_secret FROM PUBLIC;

-- One row per bound backend. A backend that ends leaves its row behind (nothing runs at disconnect): the
-- row counts only for a backend of the same pid *and* start time (pid reuse cannot inherit a binding);
-- `token` is a random value the binding also leaves in the GUC cow._bind_token, so the usual check is one
-- comparison rather than a read of the backend's start time (a caller that changes the GUC only makes the
-- check read the start time). Rows of ended backends are removed by the next bind.
CREATE TABLE IF NOT EXISTS cow.bindings (
    pid           int PRIMARY KEY,
    backend_start timestamptz NOT NULL,
    token         text NOT NULL,
    session       text NOT NULL CHECK (session ~ '^[A-Za-z0-9._:-]{1,128}$'),
    bound_at      timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON cow.bindings FROM PUBLIC;
