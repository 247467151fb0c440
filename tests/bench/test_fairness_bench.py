"""bench/fairness.py in simulator mode: the light tenant's share rises under ``fair``."""

from __future__ import annotations

import re

from paternoster.bench.fairness import main


def test_sim_mode_shows_the_light_tenant_served_more_under_fair(capsys):
    assert main(["--duration", "30", "--heavy-rate", "20", "--policies", "fcfs,fair"]) == 0
    out = capsys.readouterr().out
    assert "| fcfs | light |" in out and "| fair | heavy |" in out
    ratios = dict(re.findall(r"(\w+) (\d\.\d\d)", out.split("light/heavy output tokens:")[1]))
    assert float(ratios["fair"]) > 0.8 and float(ratios["fcfs"]) < 0.4
