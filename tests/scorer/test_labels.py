"""Label statistics against values computed by hand, and label files (CSV, JSONL, YAML, hostile)."""

from __future__ import annotations

import pytest

from schemas.errors import BadInput
from scorer import labels

# Ten runs, a yes/no target: the labels say yes for r0-r3; the scanner says yes for r0-r2 and r4.
LABELLED = {f"r{i}": i < 4 for i in range(10)}
PREDICTED = {f"r{i}": i in (0, 1, 2, 4) for i in range(10)}


def test_binary_statistics_match_the_hand_computed_values():
    r = labels.compare("scanner:x", LABELLED, PREDICTED | {"r10": True}, link="http://v")
    # tp = 3 (r0-r2), fp = 1 (r4), fn = 1 (r3), tn = 5.
    assert r["precision"] == pytest.approx(3 / 4) and r["recall"] == pytest.approx(3 / 4)
    assert r["f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    assert r["agreement"] == pytest.approx(0.8)
    # Cohen: p_o = 0.8; both say yes 4 times in 10: p_e = 0.4 * 0.4 + 0.6 * 0.6 = 0.52.
    assert r["kappa"] == pytest.approx((0.8 - 0.52) / (1 - 0.52))
    # Krippendorff (nominal, two coders, 20 values: 8 yes, 12 no; 2 disagreeing units, each
    # one yes-no pair either way): 1 - (n - 1) * o_yn / (n_y * n_n) = 1 - 19 * 2 / (8 * 12).
    assert r["alpha"] == pytest.approx(1 - 19 * 2 / 96)
    assert [(d["run_id"], d["link"]) for d in r["disagreements"]] == [
        ("r3", "http://v/runs/r3"),
        ("r4", "http://v/runs/r4"),
    ]
    assert {(c["label"], c["predicted"]): c["runs"] for c in r["confusion"]} == {
        ("false", "false"): 5,
        ("false", "true"): 1,
        ("true", "false"): 1,
        ("true", "true"): 3,
    }
    lo, hi = r["intervals"]["kappa"]
    assert lo <= r["kappa"] <= hi and r["intervals"] == labels.compare("s", LABELLED, PREDICTED)["intervals"]
    assert r["runs"] == 10 and r["missing"] == []


def test_categorical_statistics_and_missing_runs():
    lab = {"a": 1.0, "b": 0.5, "c": 0.0, "d": 1.0}
    pred = {"a": 1.0, "b": 0.0, "c": 0.0}
    r = labels.compare("item:s3", lab, pred)
    assert r["runs"] == 3 and r["missing"] == ["d"] and "precision" not in r
    # p_o = 2/3; labels 1, .5, 0 once each; predictions 1 once, 0 twice: p_e = (1*1 + 1*2) / 9.
    assert r["kappa"] == pytest.approx((2 / 3 - 3 / 9) / (1 - 3 / 9))


def test_codes_from_judge_rows():
    rows = [
        {"run_id": "a", "codes": ["E3"], "details": {"items": [{"id": "s1", "value": 1.0}]}},
        {"run_id": "b", "codes": [], "details": {"items": [{"id": "s1", "value": 0.0}]}},
    ]
    got = {
        r["target"]: r
        for r in labels.validate_judge(
            rows, {"codes": {"a": ["E3"], "b": ["E3"]}, "item:s1": {"a": 1, "b": 1}}
        )
    }
    assert got["code:E3"]["recall"] == 0.5 and got["code:E3"]["precision"] == 1.0
    assert got["code:E1"]["agreement"] == 1.0 and got["item:s1"]["agreement"] == 0.5


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("l.csv", "run_id,target,value,annotator\nr1,codes,E3;E5,ana\nr1,scanner:x,true,\n"),
        (
            "l.jsonl",
            '{"run_id": "r1", "target": "codes", "value": ["E5", "E3"], "annotator": "ana"}\n'
            '{"run_id": "r1", "target": "scanner:x", "value": true}\n',
        ),
        (
            "l.yaml",
            "- {run_id: r1, target: codes, value: [E3, E5], annotator: ana}\n"
            "- {run_id: r1, target: 'scanner:x', value: true}\n",
        ),
    ],
)
def test_label_files_in_every_format_read_the_same(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    records, digest = labels.read(path)
    assert records == [
        {"run_id": "r1", "target": "codes", "value": ["E3", "E5"], "annotator": "ana"},
        {"run_id": "r1", "target": "scanner:x", "value": True, "annotator": None},
    ]
    assert digest.startswith("sha256:")


@pytest.mark.parametrize(
    "text",
    [
        "run_id,target,value\n,codes,E1\n",
        "run_id,target,value\nr1,<script>,1\n",
        "run_id,target,value\nr1,codes,E1;DROP TABLE\n",
        "run_id,target,value\n",
        "\x00\xff",
    ],
)
def test_hostile_label_files_are_refused(tmp_path, text):
    path = tmp_path / "l.csv"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    with pytest.raises(BadInput):
        labels.read(path)


def test_a_label_file_of_another_kind_is_refused_saying_which_kinds_are_read(tmp_path):
    path = tmp_path / "l.json"
    path.write_text("[]")
    with pytest.raises(BadInput) as e:
        labels.read(path)
    assert str(e.value) == f"{str(path)!r}: labels come as .csv, .jsonl or .yaml"


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("l.jsonl", '{"run_id": "r1", "target": "scanner:x", "value": NaN}\n', "is nan, not a finite number"),
        ("l.jsonl", '{"run_id": "r1", "target": "item:s1", "value": 1e999}\n', "is inf, not a finite number"),
        ("l.yaml", "- {run_id: r1, target: 'scanner:x', value: .nan}\n", "is nan, not a finite number"),
        ("l.jsonl", '{"run_id": "r1", "target": "scanner:x", "value": [{"a": 1}]}\n', "is list, not yes/no"),
        ("l.jsonl", '{"run_id": "r1", "target": "scanner:x", "value": true, "annotator": 7}\n', "annotator"),
        ("l.jsonl", '{"run_id": "r1", "target": "scanner:x", "value": "\\ud800"}\n', "not UTF-8"),
        (
            "l.csv",
            "run_id,target,value\nr1,scanner:x,true\nr2,scanner:x,true\nr1,scanner:x,false\n",
            "record 3: run 'r1' scanner:x is labelled False here and True in record 1",
        ),
    ],
)
def test_label_values_the_store_cannot_compare_are_refused_naming_the_record(tmp_path, name, text, said):
    """A label that is no finite yes/no, number or text, or a second label of a run and target that
    says something else (which of the two would count?), refuses the file, naming the record."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BadInput, match="record") as e:
        labels.read(path)
    assert said in str(e.value)


def test_the_same_label_given_twice_is_one_judgement(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text("run_id,target,value\nr1,scanner:x,true\nr1,scanner:x,yes\n")
    records, _ = labels.read(path)
    assert [r["value"] for r in records] == [True, True]


def test_a_spreadsheets_csv_with_a_byte_order_mark_reads_as_any_csv(tmp_path):
    path = tmp_path / "l.csv"
    path.write_bytes(b"\xef\xbb\xbfrun_id,target,value\r\nr1,scanner:x,true\r\n")
    records, _ = labels.read(path)
    assert records == [{"run_id": "r1", "target": "scanner:x", "value": True, "annotator": None}]


@pytest.mark.parametrize(
    ("name", "text", "kinds"),
    [
        (
            "l.csv",
            "run_id,target,value\nr1,scanner:x,yes\nr2,scanner:x,maybe\n",
            "yes/no (record 1) and text (record 2)",
        ),
        (
            "l.csv",
            "run_id,target,value\nr1,item:s1,1\nr2,item:s1,0\nr3,item:s1,fine\n",
            "number (record 1) and text (record 3)",
        ),
        (
            "l.jsonl",
            '{"run_id": "r1", "target": "scanner:x", "value": 1}\n'
            '{"run_id": "r2", "target": "scanner:x", "value": false}\n',
            "number (record 1) and yes/no (record 2)",
        ),
    ],
)
def test_a_target_whose_labels_mix_kinds_is_refused_naming_it_and_both_kinds(tmp_path, name, text, kinds):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(BadInput) as e:
        labels.read(path)
    target = "item:s1" if "item:s1" in text else "scanner:x"
    assert f"target {target} mixes {kinds} labels" in str(e.value)


def test_targets_of_different_kinds_in_one_file_are_fine(tmp_path):
    path = tmp_path / "l.csv"
    path.write_text(
        "run_id,target,value\nr1,scanner:x,yes\nr1,item:s1,2\nr1,scanner:y,why\nr2,scanner:y,no reason\n"
    )
    records, _ = labels.read(path)
    assert [r["value"] for r in records] == [True, 2.0, "why", "no reason"]
