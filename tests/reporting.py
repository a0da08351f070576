"""Figures a test shows: ``record_property(REPORT_PROPERTY, text)`` in a test, printed at the end
of the run by ``conftest.py`` (fuzzing counts, load tables); unlike a print, it survives output
capture and pytest-xdist."""

REPORT_PROPERTY = "report"
