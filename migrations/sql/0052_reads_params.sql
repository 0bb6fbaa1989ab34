-- cowproxy copy-on-write layer, version 52: cow.reads keeps a read's Bind parameters instead of its identity.
-- Hashing the identity (BLAKE2b of the text and the parameters) was the largest item of the proxy's own
-- cost per recorded read (docs/benchmarks.md, "Read traces: the identity off the proxy"); readers derive it
-- from the statement and the parameters (cowproxy/read_identity.py), with the same value. Rows written before
-- keep their identity; rows the proxy writes from this version have identity NULL and params set (NULL
-- params: a simple query's read, whose identity is the text's alone).
ALTER TABLE cow.reads
    ADD COLUMN IF NOT EXISTS params bytea,
    ALTER COLUMN identity DROP NOT NULL;
