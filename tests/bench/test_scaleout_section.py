"""The scale-out benchmark's section of bench/RESULTS.md survives the other benchmarks."""

from __future__ import annotations

from bench.algorithms import keep_peers_section
from bench.scaleout import SECTION_END, SECTION_START, replace_marked_section


def test_the_scaleout_section_is_appended_then_replaced_in_place():
    first = replace_marked_section("# Results\n\nalgorithms\n", "## Scale-out\n\nold")
    assert (
        first == f"# Results\n\nalgorithms\n\n{SECTION_START}\n## Scale-out\n\nold\n{SECTION_END}\n"
    )
    second = replace_marked_section(first + "\ntrailing text\n", "## Scale-out\n\nnew")
    assert second.count(SECTION_START) == 1
    assert "old" not in second and "## Scale-out\n\nnew" in second
    assert second.endswith("\ntrailing text\n")


def test_rewriting_the_algorithms_keeps_every_marked_section():
    previous = (
        "# old algorithms\n\n<!-- peers:start -->\npeers\n<!-- peers:end -->\n\n"
        f"{SECTION_START}\nscale-out\n{SECTION_END}\n\n"
        "<!-- serving:start -->\nserving\n<!-- serving:end -->\n"
    )
    rewritten = keep_peers_section("# new algorithms\n", previous)
    assert rewritten == (
        "# new algorithms\n\n<!-- peers:start -->\npeers\n<!-- peers:end -->\n\n"
        f"{SECTION_START}\nscale-out\n{SECTION_END}\n\n"
        "<!-- serving:start -->\nserving\n<!-- serving:end -->\n"
    )
