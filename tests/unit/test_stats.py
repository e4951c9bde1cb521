import pytest

from verl_grpo.stats import compare_paired, mcnemar_exact, paired_bootstrap


def test_mcnemar_exact_matches_the_two_sided_binomial():
    assert mcnemar_exact(10, 0) == pytest.approx(2 * 0.5**10)
    assert mcnemar_exact(0, 10) == pytest.approx(2 * 0.5**10)
    # 7 vs 3 discordant: 2 * P(X <= 3 | n=10, p=1/2) = 2 * 176/1024
    assert mcnemar_exact(7, 3) == pytest.approx(2 * 176 / 1024)
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 0) == 1.0


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError, match="discordant"):
        mcnemar_exact(-1, 2)


def test_compare_paired_counts_each_cell():
    a = [1, 1, 1, 0, 0, 1]
    b = [1, 0, 0, 1, 0, 1]
    cmp = compare_paired(a, b)
    assert (cmp.n, cmp.a_only, cmp.b_only, cmp.both, cmp.neither) == (6, 2, 1, 2, 1)
    assert cmp.mean_a == pytest.approx(4 / 6) and cmp.delta == pytest.approx(1 / 6)
    assert cmp.mcnemar_p == pytest.approx(1.0)
    metrics = cmp.as_metrics()
    assert metrics["promotion.challenger_only"] == 2 and metrics["promotion.champion_only"] == 1


def test_clearly_better_model_is_significant_and_equal_models_are_not():
    better = compare_paired([1] * 30 + [0] * 10, [1] * 10 + [0] * 30)
    assert better.mcnemar_p < 1e-5 and better.bootstrap_p < 0.001
    assert 0.3 < better.ci_low < better.delta == 0.5 < better.ci_high < 0.7
    same = compare_paired([1, 0] * 20, [1, 0] * 20)
    assert same.mcnemar_p == 1.0 and same.bootstrap_p == 1.0


def test_bootstrap_is_seeded():
    a, b = [1, 0, 1, 1, 0, 1, 0, 1], [0, 0, 1, 0, 1, 1, 0, 0]
    assert paired_bootstrap(a, b, seed=3) == paired_bootstrap(a, b, seed=3)


@pytest.mark.parametrize("a, b", [([1, 0], [1]), ([], [])])
def test_mismatched_or_empty_samples_are_refused(a, b):
    with pytest.raises(ValueError, match="paired samples"):
        compare_paired(a, b)
