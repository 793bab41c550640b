"""Files written whole or not at all (mdk/atomic_file.py)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from mdk.atomic_file import replacing, write_json, write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "a" / "doc.json"
    write_json(p, {"x": 1}, indent=1)
    assert json.loads(p.read_text()) == {"x": 1} and p.read_text().endswith("}\n")
    with pytest.raises(RuntimeError):
        with replacing(p) as f:
            f.write('{"x": 2')  # half a document, then the writer fails
            raise RuntimeError("killed mid-write")
    assert json.loads(p.read_text()) == {"x": 1}
    assert sorted(x.name for x in p.parent.iterdir()) == ["doc.json"]


def test_a_new_file_gets_the_umask_permissions_not_a_private_mode(tmp_path):
    old = os.umask(0o022)
    try:
        p = write_text(tmp_path / "caps.json", "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644 and p.read_text() == "{}\n"
