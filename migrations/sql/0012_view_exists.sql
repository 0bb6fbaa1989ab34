-- cowproxy copy-on-write layer, version 12: the unique checks' "a row of the session's view matches" is
-- cow._view_exists, which cow._sexists shares (30_generators.sql); cow._key_taken goes.
DROP FUNCTION IF EXISTS cow._key_taken(text, text, text[], text, text);
