"""benchmarks/rule_resolution.py: its statistics, and its CSV against the write-ups it transcribes."""
from __future__ import annotations

import numpy as np
import pytest
from rule_resolution import (ROOT, SEEDS_CSV, detectable_effect, expected_gains, keep_probability, load, main,
                             pooled_sd, seed_share, today_seeds)


def test_pooled_sd_takes_each_group_from_its_own_mean():
    sd, dof = pooled_sd([[1.0, 2.0, 3.0], [10.0, 12.0], [7.0]])
    assert dof == 3 and sd == pytest.approx((4 / 3) ** 0.5)


def test_seed_share_is_one_for_independent_recipes_and_less_for_shared_seeds():
    assert seed_share(1.0, 2 ** 0.5) == pytest.approx(1.0)
    assert seed_share(1.0, 5.0) == 1.0
    assert seed_share(1.0, 1.0) == pytest.approx(0.5)


def test_a_lucky_seed_of_todays_is_expected_to_be_given_back():
    means, sd = expected_gains([80.0, 78.0], centre=79.0, sd_seed=1.0, sd_difference=1.0, effect=0.2)
    assert means == pytest.approx([0.2 - 0.5, 0.2 + 0.5]) and sd == pytest.approx((0.5 + 0.25) ** 0.5)


def test_the_rule_keeps_large_gains_and_drops_large_losses():
    rng = np.random.default_rng(0)
    today = [79.6, 77.9, 78.9]
    assert keep_probability(today, 78.7, 0.7, 0.8, 5.0, 2000, rng) == 1.0
    assert keep_probability(today, 78.7, 0.7, 0.8, -5.0, 2000, rng) == 0.0
    small, large = (keep_probability(today, 78.7, 0.7, 0.8, e, 20000, rng) for e in (0.3, 1.0))
    assert 0 < small < large < 1


def test_detectable_effect_shrinks_with_the_square_root_of_the_seeds():
    assert detectable_effect(1.0, 1) == pytest.approx(1.6449 + 0.8416, abs=1e-3)
    assert detectable_effect(1.0, 4) == pytest.approx(detectable_effect(1.0, 1) / 2)


def test_every_figure_of_the_csv_is_in_the_write_up_it_names():
    changes = load(SEEDS_CSV)
    written = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    for rows in changes.values():
        for row in rows:
            assert row["source"].startswith("docs/internals.md")
            assert f"{row['dev_map']:.2f}" in written, (row["change"], row["seed"])
    assert sorted(today_seeds(changes)) == [0, 1, 2, 3, 4, 5]


def test_main_prints_every_change_and_the_command(capsys):
    assert main(["--draws", "1000"]) == 0
    out = capsys.readouterr().out
    for change in load(SEEDS_CSV):
        assert change in out
    assert ".venv/bin/python benchmarks/rule_resolution.py" in out


def test_a_missing_csv_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--csv", str(tmp_path / "none.csv")])
    assert "not found" in capsys.readouterr().err
