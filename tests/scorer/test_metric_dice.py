"""Dice from one confusion-matrix pass: hand-computed fixtures and a cross-check against per-label masks."""

from __future__ import annotations

import numpy as np
import pytest

from scorer.metrics import dice as dice_mod
from scorer.metrics.dice import (
    binary_counts,
    binary_dice,
    confusion,
    dice_from_counts,
    dice_per_label,
    label_histogram,
    multiclass_dice,
)


def per_label_reference(pred: np.ndarray, ref: np.ndarray, labels) -> dict[int, float]:
    """The obvious implementation: one boolean mask pair per label."""
    out = {}
    for lab in labels:
        p, g = pred == lab, ref == lab
        denom = int(p.sum()) + int(g.sum())
        out[lab] = 1.0 if denom == 0 else 2.0 * int((p & g).sum()) / denom
    return out


def test_hand_computed_multiclass():
    # pred/ref over 8 voxels; label 1: tp 1, |P| 1, |G| 2 → 2/3; label 2: tp 2, |P| 3, |G| 2 → 4/5;
    # label 3: predicted only → 0; label 4: absent from both → 1.
    ref = np.array([1, 1, 2, 2, 0, 0, 0, 0], np.uint8).reshape(2, 2, 2)
    pred = np.array([1, 2, 2, 2, 3, 0, 0, 0], np.uint8).reshape(2, 2, 2)
    d = multiclass_dice(pred, ref, [1, 2, 3, 4])
    assert d == pytest.approx({1: 2 / 3, 2: 4 / 5, 3: 0.0, 4: 1.0})


def test_confusion_counts_every_pair():
    ref = np.array([0, 1, 1, 2, 2, 2], np.uint8)
    pred = np.array([0, 1, 2, 2, 2, 0], np.uint8)
    m = confusion(pred, ref, 3, 3)
    expected = np.array([[1, 0, 1], [0, 1, 0], [0, 1, 2]])
    np.testing.assert_array_equal(m, expected)
    assert m.sum() == ref.size


@pytest.mark.parametrize(
    ("tp", "n_pred", "n_ref", "expected"),
    [(0, 0, 0, 1.0), (0, 3, 0, 0.0), (0, 0, 3, 0.0), (2, 2, 2, 1.0), (1, 2, 3, 0.4)],
    ids=["both-empty", "pred-only", "ref-only", "perfect", "partial"],
)
def test_empty_conventions(tp, n_pred, n_ref, expected):
    assert dice_from_counts(np.array([tp]), np.array([n_pred]), np.array([n_ref]))[0] == pytest.approx(
        expected
    )


def test_labels_beyond_the_matrix_are_empty():
    m = confusion(np.zeros(4, np.uint8), np.zeros(4, np.uint8), 1, 1)
    assert dice_per_label(m, [5]) == {5: 1.0}
    m = confusion(np.array([0, 5], np.uint8), np.zeros(2, np.uint8), 6, 1)
    assert dice_per_label(m, [5]) == {5: 0.0}


@pytest.mark.parametrize("n_labels", [2, 14, 118])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_per_label_masks(n_labels, seed, monkeypatch):
    # Small slabs force many bincount passes, so slab boundaries are exercised too.
    monkeypatch.setattr(dice_mod, "SLAB_VOXELS", 97)
    rng = np.random.default_rng(seed)
    ref = rng.integers(0, n_labels, (9, 11, 13)).astype(np.uint8)
    pred = ref.copy()
    flip = rng.random(ref.shape) < 0.3
    pred[flip] = rng.integers(0, n_labels, int(flip.sum()))
    labels = list(range(1, n_labels + 3))  # two labels absent from both
    assert multiclass_dice(pred, ref, labels) == pytest.approx(
        per_label_reference(pred, ref, labels), abs=1e-12
    )


def test_fortran_ordered_arrays_match_c_ordered(monkeypatch):
    monkeypatch.setattr(dice_mod, "SLAB_VOXELS", 60)  # slabs along the last axis (F) or the first (C)
    rng = np.random.default_rng(3)
    ref = rng.integers(0, 5, (6, 7, 8)).astype(np.uint8)
    pred = rng.integers(0, 5, (6, 7, 8)).astype(np.uint8)
    expected = multiclass_dice(pred, ref, [1, 2, 3, 4])
    assert multiclass_dice(np.asfortranarray(pred), np.asfortranarray(ref), [1, 2, 3, 4]) == pytest.approx(
        expected
    )


def test_large_label_ids_use_a_wide_index():
    ref = np.array([0, 300, 300, 7], np.uint16)
    pred = np.array([0, 300, 7, 7], np.uint16)
    assert multiclass_dice(pred, ref, [7, 300]) == pytest.approx({7: 2 / 3, 300: 2 / 3})


def test_binary_counts_one_pass_equals_separate_targets(monkeypatch):
    monkeypatch.setattr(dice_mod, "SLAB_VOXELS", 50)
    rng = np.random.default_rng(7)
    shape = (8, 9, 10)
    organ_ref = rng.random(shape) < 0.4
    organ_pred = organ_ref ^ (rng.random(shape) < 0.1)
    lesion_ref = organ_ref & (rng.random(shape) < 0.2)
    lesion_pred = rng.random(shape).astype(np.float32)  # probabilities: binarised at 0.5
    m_organ, m_lesion = binary_counts([(organ_pred, organ_ref), (lesion_pred, lesion_ref)], 0.5)
    assert binary_dice(m_organ) == pytest.approx(per_label_reference(organ_pred, organ_ref, [True])[True])
    assert binary_dice(m_lesion) == pytest.approx(
        per_label_reference(lesion_pred > 0.5, lesion_ref, [True])[True]
    )
    assert m_organ.sum() == m_lesion.sum() == organ_ref.size


def test_binary_counts_hand_computed():
    # organ: tp 2, fp 2, fn 2 → 0.5; lesion: tp 1, fp 0, fn 1 → 2/3
    organ_ref = np.array([1, 1, 1, 1, 0, 0, 0, 0], np.uint8)
    organ_pred = np.array([1, 1, 0, 0, 1, 1, 0, 0], np.uint8)
    lesion_ref = np.array([1, 1, 0, 0, 0, 0, 0, 0], np.uint8)
    lesion_pred = np.array([1, 0, 0, 0, 0, 0, 0, 0], np.uint8)
    m_organ, m_lesion = binary_counts([(organ_pred, organ_ref), (lesion_pred, lesion_ref)])
    np.testing.assert_array_equal(m_organ, [[2, 2], [2, 2]])
    assert binary_dice(m_organ) == pytest.approx(0.5)
    assert binary_dice(m_lesion) == pytest.approx(2 / 3)


def test_binary_counts_rejects_bad_arity_and_shapes():
    a = np.zeros(3)
    with pytest.raises(ValueError):
        binary_counts([])
    with pytest.raises(ValueError):
        binary_counts([(a, np.zeros(4))])


def test_label_histogram_counts_values(monkeypatch):
    monkeypatch.setattr(dice_mod, "SLAB_VOXELS", 5)
    labels = np.array([[0, 1, 1], [3, 3, 3]], np.uint8).T.copy()
    np.testing.assert_array_equal(label_histogram(labels, 4), [1, 2, 0, 3])


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        confusion(np.zeros((2, 2), np.uint8), np.zeros((2, 3), np.uint8), 1, 1)


@pytest.mark.parametrize("threshold", [-0.5, 0.0, 0.5, 1.0, 1.5])
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int16, np.float32])
def test_binarisation_matches_a_float_comparison(dtype, threshold):
    values: np.ndarray = np.array([-1, 0, 0, 1, 1, 2, 3, 0], dtype=np.float64)
    if dtype == np.bool_:
        values = values > 0
    arr = values.astype(dtype)
    expected = arr.astype(np.float64) > threshold
    np.testing.assert_array_equal(dice_mod._above(arr, threshold), expected)
