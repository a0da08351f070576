"""The sections of bench/RESULTS.md: each benchmark rewrites its own and keeps the others'."""

from __future__ import annotations

from bench.sections import keep_sections, markers, replace_section, write_section


def test_a_section_is_appended_then_replaced_in_place():
    start, end = markers("scaleout")
    document = "# Results\n\nalgorithms\n"
    first = replace_section(document, "scaleout", "## Scale-out\n\nold")
    assert first == f"# Results\n\nalgorithms\n\n{start}\n## Scale-out\n\nold\n{end}\n"
    second = replace_section(first + "\ntrailing text\n", "scaleout", "## Scale-out\n\nnew")
    assert second.count(start) == 1 and second.count(end) == 1
    assert "old" not in second and "## Scale-out\n\nnew" in second
    assert second.startswith(document.rstrip())
    assert second.endswith(f"new\n{end}\n\ntrailing text\n")
    assert replace_section("", "peers", "x") == "<!-- peers:start -->\nx\n<!-- peers:end -->\n"


def test_a_section_leaves_the_other_sections_alone():
    document = replace_section(replace_section("", "peers", "peers"), "load", "load old")
    rewritten = replace_section(document, "load", "load new")
    assert "<!-- peers:start -->\npeers\n<!-- peers:end -->" in rewritten
    assert "load old" not in rewritten and "load new" in rewritten


def test_markers_out_of_order_append_a_fresh_section():
    start, end = markers("serving")
    broken = f"{end}\nstray\n{start}\n"
    fixed = replace_section(broken, "serving", "text")
    assert fixed.endswith(f"{start}\ntext\n{end}\n")


def test_rewriting_the_algorithms_keeps_every_marked_section():
    previous = (
        "# old algorithms\n\n<!-- peers:start -->\npeers\n<!-- peers:end -->\n\n"
        "<!-- scaleout:start -->\nscale-out\n<!-- scaleout:end -->\n\n"
        "<!-- serving:start -->\nserving\n<!-- serving:end -->\n"
    )
    assert keep_sections("# new algorithms\n", previous) == (
        "# new algorithms\n\n<!-- peers:start -->\npeers\n<!-- peers:end -->\n\n"
        "<!-- scaleout:start -->\nscale-out\n<!-- scaleout:end -->\n\n"
        "<!-- serving:start -->\nserving\n<!-- serving:end -->\n"
    )
    assert keep_sections("# only\n\n", "no sections here") == "# only\n"


def test_write_section_creates_then_updates_the_file(tmp_path):
    path = tmp_path / "RESULTS.md"
    write_section(path, "load", "first")
    write_section(path, "load", "second")
    assert path.read_text() == "<!-- load:start -->\nsecond\n<!-- load:end -->\n"
