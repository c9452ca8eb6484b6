"""The static HTML report: self-contained, renders in headless Chromium without console errors."""

import json
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from engine.cli import main
from engine.readout.report import write_report

from _item_runs import fit_run, simulate_2pl

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not on PATH (install Debian's package: apt-get install -y chromium)")


def render(page):
    """``(dom, console lines)`` of a file rendered by headless Chromium (no network needed)."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    y, _, _ = simulate_2pl(40, 30, seed=8)
    y[:, 4] = 1 - y[:, 4]  # one mislabelled item, drawn as flagged
    return fit_run(tmp, y, "2pl"), tmp


def _cluster_outputs(tmp):
    stab, dims = tmp / "stability", tmp / "dims"
    stab.mkdir(exist_ok=True)
    dims.mkdir(exist_ok=True)
    # the shapes written by `irt-engine stability` and `irt-engine dimensions`
    pd.DataFrame({"size": [10, 10, 100, 100], "method": ["irt", "accuracy"] * 2,
                  "tau_between_mean": [0.5, 0.4, 0.8, 0.7], "tau_between_q05": [0.3, 0.2, 0.7, 0.6],
                  "tau_full_mean": [0.6, 0.5, 0.9, 0.8]}).to_parquet(stab / "summary.parquet")
    pd.DataFrame({"index": [1, 2, 3], "observed": [3.0, 1.1, 0.6], "residual": [1.2, 0.9, 0.7],
                  "envelope_q95": [1.4, 1.2, 1.0]}).to_parquet(dims / "eigenvalues.parquet")
    (dims / "summary.json").write_text(json.dumps({"n_factors": 1, "details": {"x": 1}}))
    return stab, dims


@needs_chromium
def test_console_capture_sees_errors(tmp_path):
    """The harness would notice a console error (so the next test can fail)."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom'); missingFn();</script></body></html>")
    _, console = render(bad)
    assert any("boom" in ln for ln in console) and any("missingFn" in ln for ln in console)


@needs_chromium
def test_report_renders_in_chromium_with_leaderboard_rows(run_dir, capsys):
    run, tmp = run_dir
    stab, dims = _cluster_outputs(tmp)
    out = tmp / "site" / "report.html"
    assert main(["report", str(run.path), "--out", str(out), "--stability", str(stab),
                 "--dimensions", str(dims)]) == 0
    assert "6 PNGs" in capsys.readouterr().out
    dom, console = render(out)
    assert console == []
    rows = re.findall(r'<tr class="leaderboard-row" data-subject="([^"]+)"', dom)
    best = run.subjects.sort_values("ability_mean", ascending=False)["subject"].tolist()
    assert rows == best  # every subject, in leaderboard order
    assert dom.count('src="data:image/png;base64,') == 6
    for name in ("leaderboard", "p_beats", "item_curves", "items_scatter", "stability", "scree"):
        png = out.with_name(f"report_{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "n_factors: 1" in dom
    text = out.read_text()
    assert not re.search(r'(src|href)="(?!data:)', text)  # nothing fetched at view time


def test_report_without_cluster_outputs_or_store(run_dir, tmp_path):
    run, _ = run_dir
    written = write_report(run, tmp_path / "r.html", None, stability=tmp_path / "absent", items=["i4", "i0"])
    page = written["html"].read_text()
    assert "absent does not exist" in page and "not requested" in page
    assert set(written) == {"html", "leaderboard", "p_beats", "item_curves", "items_scatter"}
    assert page.count("leaderboard-row") == len(run.subjects)
    assert main(["report", str(run.path), "--out", str(tmp_path / "r.txt")]) == 2
    assert main(["report", str(run.path), "--out", str(tmp_path / "r2.html"), "--items", "zz"]) == 2
    assert not (tmp_path / "r2.html").exists()
