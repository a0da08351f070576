"""The wide-data and seeds benchmark, run at a tiny size: its sections and their targets."""

from __future__ import annotations

from bench import wide_and_seeds

TINY = ["--wide", "8", "--rows", "600", "--seeds", "1", "--seed-rows", "300", "--write"]


def test_the_benchmark_writes_both_sections_with_their_targets(tmp_path):
    output = tmp_path / "RESULTS.md"
    output.write_text("# Results\n")
    wide_and_seeds.main([*TINY, "--long-seeds", "0", "--output", str(output)])
    text = output.read_text()
    assert text.startswith("# Results\n")
    wide = text[text.index("<!-- wide-data:start -->") : text.index("<!-- wide-data:end -->")]
    assert "600 rows from 3 lines" in wide
    assert "| 8 | 0 |" in wide
    assert "| peak at p = 8 | < 3x X |" in wide
    seeds = text[text.index("<!-- seeds:start -->") : text.index("<!-- seeds:end -->")]
    assert "300 rows x 14 features" in seeds
    assert seeds.count("| 0 | ") == 1
    assert "| worst of 1 seeds | <= 1.005 x best known | 1.00000 | yes |" in seeds
