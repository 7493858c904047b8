"""The task spec schema: unknown fields are rejected, required tables enforced, case ids formatted."""

from __future__ import annotations

import copy
import tomllib

import pytest

from schemas.task_spec import TaskError, decode_spec
from tasks.registry import tasks_root


def kidney_table() -> dict:
    return tomllib.loads((tasks_root() / "kidney-seg" / "spec.toml").read_text(encoding="utf-8"))


def test_decodes_a_real_spec():
    spec = decode_spec(kidney_table())
    assert spec.id == "kidney-seg" and spec.seg is not None and spec.seg.mode == "binary"
    assert spec.case_id(0) == "case_00000"


@pytest.mark.parametrize(
    "path",
    [(), ("public",), ("submission",), ("metric",), ("seg",)],
    ids=["top", "public", "submission", "metric", "seg"],
)
def test_unknown_fields_are_rejected_at_every_level(path):
    table = copy.deepcopy(kidney_table())
    node = table
    for key in path:
        node = node[key]
    node["tyop"] = 1
    with pytest.raises(TaskError, match="unknown field `tyop`"):
        decode_spec(table, source="x.toml")


def test_wrong_types_and_bad_track_are_one_line_errors():
    table = kidney_table()
    table["time_limit_s"] = "an hour"
    with pytest.raises(TaskError, match=r"x.toml: Expected `int`, got `str` - at `\$.time_limit_s`"):
        decode_spec(table, source="x.toml")
    table = kidney_table()
    table["track"] = "classification"
    with pytest.raises(TaskError, match="track"):
        decode_spec(table)


def test_segmentation_requires_a_seg_table():
    table = kidney_table()
    del table["seg"]
    with pytest.raises(TaskError, match=r"without a \[seg\] table"):
        decode_spec(table)


def test_case_id_format_can_count_from_one():
    table = kidney_table()
    table["case_id_format"] = "sub-{n:03d}"
    assert decode_spec(table).case_id(0) == "sub-001"
