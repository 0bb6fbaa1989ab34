-- cowproxy copy-on-write layer, version 21: the session registry is the layer owner's (see
-- docs/threat-model.md). Writers register and refresh their session through cow._write_session (SECURITY
-- DEFINER) and read the registry through the layer's functions; SQL on a connection can no longer read
-- the other sessions' rows nor change a session's status. The changes tables get row-level security
-- (functions/30_generators.sql, cow._changes_table): every role sees and writes its own session's rows only.
REVOKE ALL ON cow.sessions FROM PUBLIC;
