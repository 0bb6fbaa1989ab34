-- cowproxy copy-on-write layer, version 10: signatures of generator functions that changed their arguments.
-- CREATE OR REPLACE cannot change a function's argument types, and a call that fits two overloads is
-- ambiguous, so the old signatures go here (docs/layer.md, "Migrations"); the repeatable files define the new.

-- cow._rec_code took nine, then ten arguments (30_generators.sql; twelve now).
DROP FUNCTION IF EXISTS cow._rec_code(text, text, text[], text[], text, boolean, text, text, text);
DROP FUNCTION IF EXISTS cow._rec_code(text, text, text[], text[], text, boolean, text, text, text, text);
-- cow._unchanged_since took no relation.
DROP FUNCTION IF EXISTS cow._unchanged_since(text[], text);
-- The checks of deferrable constraints take the versions they read as an argument, no longer as a `%VF%`
-- placeholder replaced in their text.
DROP FUNCTION IF EXISTS cow._defer_unique_code(oid, oid, text, text, text[]);
DROP FUNCTION IF EXISTS cow._defer_branch(int, text, text, boolean);
