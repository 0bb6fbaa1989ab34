-- cowproxy copy-on-write layer, version 59: a counter that row locks in sessions were taken in this database.
-- cow._lock_one (functions/90_row_locks.sql) moves it before its first lock; the generated UPDATE and DELETE
-- triggers wait for other transactions' row locks only once it has moved (cow._row_lock_wait_code), since
-- until then none can be held. Sequences are not transactional: a move is seen by every backend at once and
-- never rolled back. cowproxy install regenerates the enabled tables' triggers afterwards.
CREATE SEQUENCE IF NOT EXISTS cow.row_locks;
GRANT USAGE, SELECT ON SEQUENCE cow.row_locks TO PUBLIC;
-- An upgrade while a transaction of a session holds a row lock taken by layer 58's cow._lock_one (which did
-- not move the counter): moved here, so that the new triggers wait for it as the old ones did.
SELECT pg_catalog.nextval('cow.row_locks')
WHERE EXISTS (SELECT FROM pg_catalog.pg_locks l
              WHERE l.locktype = 'advisory' AND l.objsubid = 2
                AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                                  WHERE d.datname = pg_catalog.current_database()));
