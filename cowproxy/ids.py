"""Session and operation ids: 1-128 characters of ``[A-Za-z0-9._:-]`` (UUIDs fit), wherever they come from
(the layer's ``cow.valid_id`` checks the same in SQL)."""

from __future__ import annotations

import re

ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ID_RULE = "1-128 characters of [A-Za-z0-9._:-]"


def valid_id(value: str) -> bool:
    return ID_PATTERN.fullmatch(value) is not None
