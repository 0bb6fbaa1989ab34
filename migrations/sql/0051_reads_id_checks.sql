-- cowproxy copy-on-write layer, version 51: cow.reads checks its ids with an equivalent pattern PostgreSQL
-- matches ~25x faster. The bounded repetition of '^[A-Za-z0-9._:-]{1,128}$' costs ~7.5 µs per value on
-- PostgreSQL 15 (its regex engine unrolls the bound), against ~0.3 µs for '+' and a length test: two of them
-- were ~15 of the ~13-20 µs the server spends on each recorded read (docs/benchmarks.md, "Read traces: the
-- ids' CHECKs"). The ids accepted are the same: 1 to 128 characters of [A-Za-z0-9._:-].
ALTER TABLE cow.reads
    DROP CONSTRAINT IF EXISTS reads_session_check,
    DROP CONSTRAINT IF EXISTS reads_operation_check,
    ADD CONSTRAINT reads_session_check CHECK (session ~ '^[A-Za-z0-9._:-]+$' AND length(session) <= 128),
    ADD CONSTRAINT reads_operation_check
        CHECK (operation ~ '^[A-Za-z0-9._:-]+$' AND length(operation) <= 128);
