"""SQL analysis for the proxy: cow tags in comments, statement classification, tamper detection and
the rewrites that let a tagged connection use ON CONFLICT, TRUNCATE, COPY TO, MERGE and schema-qualified
names on copy-on-write tables. Pure functions and objects, no I/O."""

from __future__ import annotations

from cowproxy.ids import ID_PATTERN
from proxy.sql.analyze import (
    KINDS,
    Analysis,
    Analyzer,
    apply_tag_map,
    split_trailing_reset,
    statement_kind,
)
from proxy.sql.catalog import (
    CATALOG_DELTA_QUERY,
    CATALOG_QUERY,
    CATALOG_VERSION_QUERY,
    Catalog,
    CatalogError,
    Column,
    CowTable,
    ReferencingKey,
    UniqueKey,
)
from proxy.tags import Tags, read_comment_tags, strip_edge_comments

__all__ = [
    "CATALOG_DELTA_QUERY",
    "CATALOG_QUERY",
    "CATALOG_VERSION_QUERY",
    "ID_PATTERN",
    "KINDS",
    "Analysis",
    "Analyzer",
    "Catalog",
    "CatalogError",
    "Column",
    "CowTable",
    "ReferencingKey",
    "Tags",
    "UniqueKey",
    "apply_tag_map",
    "read_comment_tags",
    "split_trailing_reset",
    "statement_kind",
    "strip_edge_comments",
]
