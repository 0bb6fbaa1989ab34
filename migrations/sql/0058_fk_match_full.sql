-- cowproxy copy-on-write layer, version 58: a MATCH FULL foreign key is checked as PostgreSQL checks it in a
-- session (a key that mixes NULL and non-NULL values is refused, 23503; one with every column NULL references
-- nothing). The child check's generator takes whether the key is MATCH FULL (functions/30_generators.sql); its
-- earlier signature goes, so that the repeatable file's definition is the only one. cowproxy install
-- regenerates the enabled tables' triggers afterwards.
DROP FUNCTION IF EXISTS cow._fk_child_check(text, text, text, text[], text, text, text);
