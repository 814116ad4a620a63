from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from trainables.evaluation.diagnostics import (
    RANKME_EPS,
    alignment,
    anisotropy,
    pick_and_agreement,
    rankme,
    uniformity,
)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def reference_rankme(x: np.ndarray) -> float:
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum() + RANKME_EPS
    return math.exp(-sum(q * math.log(q) for q in p))


def reference_pairs(x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x[i], x[j]) for i, j in itertools.combinations(range(len(x)), 2)]


def reference_anisotropy(x: np.ndarray) -> float:
    u = unit(x)
    return float(np.mean([a @ b for a, b in reference_pairs(u)]))


def reference_uniformity(x: np.ndarray, t: float = 2.0) -> float:
    u = unit(x)
    return math.log(np.mean([math.exp(-t * float(((a - b) ** 2).sum())) for a, b in reference_pairs(u)]))


FIXED = np.random.default_rng(7).normal(size=(9, 5))


def test_rankme_of_identity_like_matrices_is_their_rank():
    for r in (1, 3, 5):
        x = np.zeros((6, 5))
        x[np.arange(r), np.arange(r)] = 2.5  # r equal singular values, the rest zero
        assert rankme(x) == pytest.approx(reference_rankme(x), abs=1e-6)
        assert rankme(x) == pytest.approx(r, abs=1e-5)  # eps moves it by ~1e-6 only
    assert rankme(FIXED) == pytest.approx(reference_rankme(FIXED), abs=1e-6)
    assert 1 < rankme(FIXED) < 5


def test_anisotropy_is_the_mean_cosine_over_distinct_pairs():
    same = np.tile([[0.3, -1.2, 2.0]], (4, 1)) * np.array([[1], [2], [0.5], [7]])  # one direction, any length
    assert anisotropy(same) == pytest.approx(1.0, abs=1e-12)
    assert anisotropy(np.eye(4)) == pytest.approx(0.0, abs=1e-12)
    antipodal = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert anisotropy(antipodal) == pytest.approx(-1.0, abs=1e-12)
    assert anisotropy(FIXED) == pytest.approx(reference_anisotropy(FIXED), abs=1e-6)
    assert math.isnan(anisotropy(FIXED[:1]))


def test_alignment_is_the_mean_squared_distance_of_each_pair():
    first, second = FIXED[:4], FIXED[4:8]
    expected = np.mean([((a - b) ** 2).sum() for a, b in zip(unit(first), unit(second), strict=True)])
    assert alignment(first, second) == pytest.approx(expected, abs=1e-6)
    assert alignment(first, 3 * first) == pytest.approx(0.0, abs=1e-12)  # a pair in one direction
    assert alignment(np.eye(2), -np.eye(2)) == pytest.approx(4.0, abs=1e-12)  # antipodal: ||u - v||^2 = 4


def test_uniformity_is_the_log_mean_gaussian_potential_over_pairs():
    antipodal = np.array([[2.0, 0.0], [-0.5, 0.0]])
    assert uniformity(antipodal) == pytest.approx(-8.0, abs=1e-12)  # log exp(-2 * 4)
    assert uniformity(np.tile([[1.0, 1.0]], (3, 1))) == pytest.approx(0.0, abs=1e-12)  # one point: log 1
    assert uniformity(FIXED) == pytest.approx(reference_uniformity(FIXED), abs=1e-6)
    assert uniformity(torch.tensor(FIXED, dtype=torch.float32)) == pytest.approx(reference_uniformity(
        FIXED.astype(np.float32).astype(np.float64)), abs=1e-6)
    many = np.random.default_rng(1).normal(size=(50, 4))  # over the cap: all pairs of a fixed subset
    assert uniformity(many, max_sentences=20) == uniformity(many, max_sentences=20)
    chosen = np.sort(np.random.default_rng(0).choice(50, 20, replace=False))
    assert uniformity(many, max_sentences=20) == pytest.approx(reference_uniformity(many[chosen]), abs=1e-6)


def test_a_diagnostic_picks_its_preferred_end_and_correlates_with_labels():
    layers, scores = [0, 1, 2, 3], [10.0, 30.0, 20.0, float("nan")]
    pick, rho = pick_and_agreement(layers, [0.9, 0.1, 0.5, 0.0], scores, direction=-1)
    assert pick == 3  # the smallest value, even on a layer without a labelled score
    assert rho == pytest.approx(1.0)  # -value ranks 0 < 2 < 1 as the scores do (layer 3 left out)
    pick, rho = pick_and_agreement(layers, [0.9, 0.1, 0.5, 0.0], scores, direction=+1)
    assert pick == 0 and rho == pytest.approx(-1.0)
    assert math.isnan(pick_and_agreement([0, 1], [1.0, 2.0], [1.0, 2.0], +1)[1])  # under 3 layers


def test_probe_rows_carry_diagnostics_of_the_same_vectors(tiny_bert, synthetic_data_dir, monkeypatch):
    """The diagnostics come from the LayerTable's one pass (one forward per chunk, counted) and equal an
    independent computation on those vectors; the picks and correlations are on every row."""
    from trainables.data.tasks import load_task
    from trainables.evaluation import probe
    from trainables.kinds.probe import ProbeConfig

    tables, forwards = [], []

    class Recorded(probe.LayerTable):
        def __init__(self, *args, **kwargs):
            original = probe.AllLayers.forward
            monkeypatch.setattr(probe.AllLayers, "forward",
                                lambda self, *a, **k: forwards.append(1) or original(self, *a, **k))
            super().__init__(*args, **kwargs)
            forwards.append("done")
            tables.append(self)

    monkeypatch.setattr(probe, "LayerTable", Recorded)
    rows = probe.probe_layers(ProbeConfig(model=tiny_bert, data_dir=str(synthetic_data_dir), splits=["dev"],
                                          precision="fp32", device="cpu"))
    assert forwards[-1] == "done" and len(forwards) > 1  # every forward ran while the table was built
    table = tables[0]
    dev = load_task("stsb", None, synthetic_data_dir).dev
    distinct = list(dict.fromkeys(list(dev.sentence1) + list(dev.sentence2)))
    for j, row in enumerate(rows):
        vectors = table.table[[table.row[s] for s in distinct], j].double().numpy()
        first = table.table[[table.row[s] for s in dev.sentence1], j].double().numpy()
        second = table.table[[table.row[s] for s in dev.sentence2], j].double().numpy()
        assert row["dev_rankme"] == pytest.approx(reference_rankme(vectors), abs=1e-6)
        assert row["dev_anisotropy"] == pytest.approx(reference_anisotropy(vectors), abs=1e-6)
        assert row["dev_uniformity"] == pytest.approx(reference_uniformity(vectors), abs=1e-6)
        assert row["dev_alignment"] == pytest.approx(np.mean(((unit(first) - unit(second)) ** 2).sum(1)), abs=1e-6)
    for name, best in (("rankme", max), ("anisotropy", min), ("alignment", min), ("uniformity", min)):
        values = [r[f"dev_{name}"] for r in rows]
        assert all(math.isfinite(v) for v in values)
        assert {r[f"dev_{name}_pick"] for r in rows} == {rows[values.index(best(values))]["layer"]}
        assert len({r[f"dev_{name}_rho"] for r in rows}) == 1 and -1 <= rows[0][f"dev_{name}_rho"] <= 1


def test_probe_command_prints_and_emits_the_diagnostics(tiny_bert, synthetic_data_dir):
    import json

    from typer.testing import CliRunner

    from orchestrator.cli import app

    runner = CliRunner()
    args = ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--split", "dev"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert all(math.isfinite(row[k]) for k in ("rankme", "anisotropy", "alignment", "uniformity"))
        assert row["rankme_pick"] in (0, 1, 2, 3) and isinstance(row["rankme_pick"], int)
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert "nan" not in table.stdout and "label-free diagnostics" in table.stdout
    for name in ("rankme", "anisotropy", "alignment", "uniformity"):
        line = next(line for line in lines if line.startswith(f"{name} picks layer "))
        assert line == (f"{name} picks layer {rows[0][f'{name}_pick']}; Spearman with the labelled layer ranking "
                        f"{rows[0][f'{name}_rho']:+.2f}")
