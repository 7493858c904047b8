"""Scoring profiles: identity by content, extends/overrides, validation errors."""

from __future__ import annotations

import pytest

from schemas.errors import UsageError
from scorer.profile import builtin_names, load


def test_builtins_load_and_differ():
    assert {"paper-2026-06", "code-2026-04"} <= set(builtin_names())
    paper, code = load("paper-2026-06"), load("code-2026-04")
    assert paper.id != code.id and paper.id.startswith("sha256:")
    assert load().id == paper.id  # the default


def test_identity_is_content_not_file(tmp_path):
    same = tmp_path / "same.toml"
    same.write_text('extends = "paper-2026-06"\n')
    assert load(str(same)).id == load("paper-2026-06").id
    edited = tmp_path / "edited.toml"
    edited.write_text(
        'extends = "paper-2026-06"\n[[rubric]]\nid = "s2b"\nstage = "S2"\ntext = "Input shape '
        'checked."\nvalues = [0, 1]\nrule = "input_checked"\n'
    )
    loaded = load(str(edited))
    assert loaded.id != load("paper-2026-06").id
    items = {i.id: i for i in loaded.profile.items_for("segmentation", "standard")}
    assert items["s2b"].text == "Input shape checked." and len(items) == 12


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('extends = "paper-2026-06"\n[weights]\nS1 = 0.5\n', "sum to 1"),
        ('extends = "paper-2026-06"\n[stages]\nnull_policy = "maybe"\n', "null_policy"),
        ('extends = "paper-2026-06"\n[metrics]\nseg_formla = "x"\n', "seg_formla"),
        ('extends = "paper-2026-06"\n[judge]\nmodle = "x"\n', "modle"),
        ('extends = "no-such-profile"\n', "no-such-profile"),
        ("this is = not toml [", "cannot read"),
    ],
    ids=["weights", "enum", "metrics-typo", "judge-typo", "missing-parent", "bad-toml"],
)
def test_bad_profiles_are_one_clear_error(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(UsageError, match=message):
        load(str(path))


def test_unknown_name():
    with pytest.raises(UsageError, match="built-in"):
        load("paper-1999")


def test_bad_rule_pattern(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        'extends = "paper-2026-06"\n[[rubric]]\nid = "x1"\nstage = "S2"\ntext = "t"\nvalues = [0, '
        '1]\nrule = "code_ran"\npattern = "(unclosed"\n'
    )
    with pytest.raises(UsageError, match="bad pattern"):
        load(str(path))
