-- cowproxy copy-on-write layer, version 5: bookkeeping of the repeatable files (functions/*.sql). `install`
-- applies a repeatable file when its SHA-256 differs from the one recorded here (or none is), after the numbered
-- files, in file name order, then records the new checksum.
CREATE TABLE IF NOT EXISTS cow.repeatables (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT ON cow.repeatables TO PUBLIC;
