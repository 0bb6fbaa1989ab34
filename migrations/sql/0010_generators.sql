-- cowproxy copy-on-write layer, version 10: the generators' shared context, and the signatures of generator
-- functions that changed their arguments (CREATE OR REPLACE cannot change a function's argument types, and a
-- call that fits two overloads is ambiguous, so the old signatures go here, docs/layer.md "Migrations"; the
-- repeatable files define the new ones).

-- What the trigger generators of one table share (30_generators.sql: cow._build_triggers and
-- cow._kl_build_triggers fill it, cow._gen_insert & co. each write one object from it). A field added later
-- is an ALTER TYPE ... ADD ATTRIBUTE in a numbered file.
-- (Like every numbered file, safe to run again.)
DO $$
BEGIN
    IF to_regtype('cow.trigger_context') IS NULL THEN
        CREATE TYPE cow.trigger_context AS (
            changes_table text,  -- the changes table's name (t<id>): the generated functions are named after it
            rel oid,             -- the app table
            keyless boolean,     -- no key: a multiset of row values (35_keyless.sql)
            ch text,             -- cow_changes.<t>, the overlay view and the app table, quoted and qualified
            v text,
            b text,
            names text[],        -- the columns; those an INSERT into the base table names; those an UPDATE sets
            ncols text[],
            setcols text[],
            pk text[],           -- the key's columns ('{}' when keyless)
            has_always boolean,  -- a GENERATED ALWAYS identity column (OVERRIDING SYSTEM VALUE)
            decl text,           -- the trigger functions' DECLARE section
            reg_code text,       -- the registry check (cow._write_session)
            dflt_ins text,       -- the per-row checks of INSERT and UPDATE (cow._row_checks)
            dflt_upd text,
            gen_code text,
            nn_code text,
            chk_code text,
            uq_ins text,         -- UNIQUE and exclusion checks of INSERT and UPDATE
            uq_upd text,
            par_del_check text,  -- this table as a FOREIGN KEY's parent: refusals and actions on DELETE and UPDATE
            par_upd_check text,
            par_del_act text,
            par_upd_act text,
            fk_all text,         -- FOREIGN KEY bits of the versions (cow._fk_child_checks)
            fk_changed text,
            dbits text,
            fk_n int,
            mark_guc text,       -- the statement mark's GUC (NULL without FOREIGN KEYs)
            pk_probe boolean,    -- the INSERT's key check looked up the key's current version (_pdel)
            dup_raise text,      -- a concurrent transaction of the session wrote the key first: 23505, 40001
            stale_raise text
        );
    END IF;
END $$;

-- cow._rec_code took nine, then ten arguments (30_generators.sql; twelve now).
DROP FUNCTION IF EXISTS cow._rec_code(text, text, text[], text[], text, boolean, text, text, text);
DROP FUNCTION IF EXISTS cow._rec_code(text, text, text[], text[], text, boolean, text, text, text, text);
-- cow._unchanged_since took no relation.
DROP FUNCTION IF EXISTS cow._unchanged_since(text[], text);
-- The checks of deferrable constraints take the versions they read as an argument, no longer as a `%VF%`
-- placeholder replaced in their text.
DROP FUNCTION IF EXISTS cow._defer_unique_code(oid, oid, text, text, text[]);
DROP FUNCTION IF EXISTS cow._defer_branch(int, text, text, boolean);
