-- cowproxy copy-on-write layer, version 55: cow.reads keeps one index instead of two. Its readers ask by
-- session in seq order (`cowproxy session reads`, the scorer, the triggers that drop a session's reads), which
-- the primary key (session, seq) serves as the index reads_session did; a primary key on seq alone served
-- nobody (seq is an identity: unique as the proxy writes it). Every recorded read is a row, and each index
-- costs the server per row: on PostgreSQL 15 the writer's COPY of pgbench -S rows went from ~3.4 to ~2.5 µs
-- of the server's CPU per row with one index instead of two (bench/reads_row_cost.py; docs/benchmarks.md,
-- "Read traces: the server's part of a recorded read").
ALTER TABLE cow.reads DROP CONSTRAINT IF EXISTS reads_pkey;
DROP INDEX IF EXISTS cow.reads_session;
ALTER TABLE cow.reads ADD CONSTRAINT reads_pkey PRIMARY KEY (session, seq);
