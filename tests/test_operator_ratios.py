"""Every arch's operators per training update against stock's, as recorded in docs/bench_operators/: a recipe that
launches more kernels than it did fails here (then make it cheaper, or rerun the tool and say why in
docs/performance.md)."""

import csv

import pytest

from conftest import REPO

RECORD = REPO / "docs" / "bench_operators" / "operators_6L_tiny.csv"


@pytest.fixture(scope="module")
def recorded():
    return {row["arch"]: row for row in csv.DictReader(RECORD.open())}


@pytest.fixture(scope="module")
def counted(toy_data, recorded):
    from deepnmt_plugin.bench.operators import count

    row = next(iter(recorded.values()))
    return count(str(toy_data), list(recorded), int(row["layers"]), row["dims"], int(row["max_tokens"]), row["precision"])


def test_the_record_covers_every_arch(recorded):
    from deepnmt_plugin.bench.operators import ARCHS

    assert list(recorded) == ARCHS


def test_the_performance_page_quotes_the_record(recorded):
    """docs/performance.md's operator table: each arch's count and ratio as recorded."""
    page = (REPO / "docs" / "performance.md").read_text()
    for arch, row in recorded.items():
        assert f"| {arch} | {row['operators']} | {row['ratio']} |" in page, arch


@pytest.mark.slow
def test_every_arch_launches_the_operators_recorded(counted, recorded):
    """The count is the machine's and the corpus's only through the batch's shape: the toy corpus gives the record's."""
    assert {arch: int(row["operators"]) for arch, row in recorded.items()} == counted


# docs/performance.md's bounds on an update's operators against stock's: 1.05, and 1.1 for the recipes whose trainable
# per-sublayer or cross-layer weights add their own gradients. Three recipes are over theirs until fused kernels exist
# for their elementwise work (the page says why); they are named, so that one brought within its bound is moved.
WEIGHTED = {"transformer_admin", "transformer_dlcl", "transformer_denseformer", "transformer_hyper"}
UNFUSED = {"transformer_dyt", "transformer_sigma", "transformer_hyper"}


def test_every_arch_stays_within_its_operator_bound(recorded):
    for arch, row in recorded.items():
        bound = 1.1 if arch in WEIGHTED else 1.05
        within = float(row["ratio"]) <= bound
        assert within != (arch in UNFUSED), (arch, row["ratio"], bound)
