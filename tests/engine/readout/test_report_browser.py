"""The demo's report in a real browser: headless Chromium loads every image, logs no
console error, has every section, and sorts the leaderboard on a header click.

Skipped, with the reason, where Debian's ``chromium`` is not installed (``make test``
installs it when it runs as root with apt-get).
"""

import re
import shutil
import subprocess

import pytest

from engine.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not on PATH: install Debian's package (apt-get install -y chromium)")
SECTIONS = ("leaderboard", "p-beats", "items", "item-curves", "item-map", "compare", "stability", "scree")

# Appended to a copy of the page: after the load event, record what the browser made of it.
PROBE = """<script>window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-images', ok.length + '/' + imgs.length);
  var heads = Array.prototype.slice.call(document.querySelectorAll('#leaderboard th'));
  var th = heads.filter(function (h) { return h.textContent.trim() === 'accuracy'; })[0];
  th.click();
  var rows = document.querySelectorAll('#leaderboard tbody tr');
  document.body.setAttribute('data-sorted', rows[0].dataset.subject + '|' + rows[rows.length - 1].dataset.subject);
});</script>"""


def render(page):
    """``(dom after load, console lines)`` of a file rendered by headless Chromium."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--out", str(tmp / "d")]) == 0
    assert main(["report", str(tmp / "d" / "run"), "--out", str(tmp / "report.html")]) == 0
    return tmp / "report.html", tmp / "d" / "run"


def test_console_capture_sees_errors(tmp_path):
    """The harness notices a console error and a broken image (so the next test can fail)."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><img src='data:image/png;base64,AAAA'>"
                   "<script>console.error('boom'); missingFn();</script></body></html>")
    _, console = render(bad)
    assert any("boom" in ln for ln in console) and any("missingFn" in ln for ln in console)
    probe = tmp_path / "probe.html"
    probe.write_text(bad.read_text().replace("console.error('boom'); missingFn();", "")
                     .replace("</body>", PROBE.replace("th.click();", "") + "</body>"))
    dom, _ = render(probe)
    assert 'data-images="0/1"' in dom


def test_demo_report_renders(demo_report):
    page, run_dir = demo_report
    dom, console = render(page)
    assert console == [], console
    for section in SECTIONS:
        assert f'id="sec-{section}"' in dom
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom, console = render(probe)
    assert console == [], console
    loaded, total = map(int, re.search(r'data-images="(\d+)/(\d+)"', dom).groups())
    assert loaded == total == 4  # leaderboard, P(beats), item curves, difficulty map
    # one click on "accuracy" sorts ascending: the least accurate system first
    from engine.run import load_run

    subjects = load_run(run_dir).subjects.sort_values("accuracy", kind="stable")["subject"].tolist()
    assert re.search(r'data-sorted="([^"]*)"', dom).group(1) == f"{subjects[0]}|{subjects[-1]}"
    # the review lists no set-aside item and says how many were set aside
    assert re.search(r'id="set-aside">\d+ items: no information: every subject answered alike', dom)
