"""bench.before_after: the report's ratios and the CPU clock of its child processes."""

from bench.before_after import ROOT, _run_child, report


def test_report_gives_speed_ups_as_anchor_over_fit_and_am_as_fit_over_products():
    runs = [
        {
            "round": 1,
            "code": "after",
            "rows": {
                "Friedman 1, ransac, h = 100": [9.0, 0.03],
                "gradient AM, step 0.1": [2.0, 4.0],
            },
        }
    ]
    text = report(runs, "abc1234", "python -m bench.before_after --revision abc1234")
    assert "| Friedman 1, ransac, h = 100 | 1 | after | 9.000 | 0.0300 | 300.00x |" in text
    assert "| gradient AM, step 0.1 | 1 | after | 2.000 | 4.0000 | 2.00x |" in text
    assert "revision abc1234" in text


def test_cpu_clock_leaves_out_time_spent_waiting():
    code = """
import json, time
from bench.algorithms import _best_times
print(json.dumps({"sleep": _best_times([lambda: time.sleep(0.3)], 1)}))
"""
    assert _run_child(code, ROOT, "wall")["sleep"][0] >= 0.3
    assert _run_child(code, ROOT, "cpu")["sleep"][0] < 0.1
