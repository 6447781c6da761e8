"""The bench and plan reports' memory-time chart, rendered in a real browser (headless Chromium from Debian's
packages): the geometry people see -- labels that never overlap, points spread over the plot,
round ticks -- measured by the browser's own layout, not by ckcheck's arithmetic.
"""

import json
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Injected after the report: measures the chart as laid out and writes the figures into the page.
MEASURE = """
<script>
window.addEventListener('load', () => {
  const svg = document.querySelector('svg.bench-chart');
  const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const out = {
    plot: box(svg.querySelector('rect.plot')),
    labels: [...svg.querySelectorAll('text.label')].map(t => ({text: t.textContent, box: box(t)})),
    points: [...svg.querySelectorAll('.point')].map(box),
    xticks: [...svg.querySelectorAll('text.tick[text-anchor=middle]')].map(t => t.textContent),
    yticks: [...svg.querySelectorAll('text.tick[text-anchor=end]')].map(t => t.textContent),
  };
  const pre = document.createElement('pre');
  pre.id = 'geometry';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def geometry(html_path, tmp_path):
    page = tmp_path / "measured.html"
    page.write_text(html_path.read_text() + MEASURE)
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=2000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="geometry">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    return json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"'))


def overlapping(labels):
    pairs = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a["box"], b["box"]
            if ax0 < bx1 and bx0 < ax1 and ay0 < by1 and by0 < ay1:
                pairs.append((a["text"], b["text"]))
    return pairs


def round_ticks(ticks):
    """Evenly spaced ticks whose step is 1, 2 or 5 times a power of ten."""
    values = [float(t) for t in ticks]
    steps = {round(b - a, 9) for a, b in zip(values, values[1:])}
    if len(steps) != 1:
        return False
    step = steps.pop()
    mantissa = step / 10 ** __import__("math").floor(__import__("math").log10(step))
    return any(abs(mantissa - m) < 1e-6 for m in (1, 2, 5, 10))


pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is installed by scripts/install-deps.sh --tests")


def test_the_bench_chart_as_a_browser_lays_it_out(ckcheck, tmp_path):
    html = tmp_path / "bench.html"
    r = ckcheck("bench", "--model", "transformer", "--layers", "4", "--hidden", "64", "--seq", "32",
                "--policies", "none,every:1,every:2,every:4,segments:sqrt,sites:*.attn,sites:*.ffn",
                "--steps", "3", "--warmup", "1", "--time-budget", "3", "--memory-budget", "2600KiB",
                "--report", f"html={html}")
    assert r.code == 0, r.out + r.err
    g = geometry(html, tmp_path)
    plot = g["plot"]
    width, height = plot[2] - plot[0], plot[3] - plot[1]
    assert not overlapping(g["labels"]), overlapping(g["labels"])
    for label in g["labels"]:
        x0, y0, x1, y1 = label["box"]
        assert plot[0] <= x0 and x1 <= plot[2] and plot[1] <= y0 and y1 <= plot[3], label
    policies = [p["policy"] for p in r.report["policies"] if p["peak_bytes"] is not None]
    assert len(g["points"]) == len(policies)
    named = " ".join(label["text"] for label in g["labels"])
    assert all(p in named for p in policies), (policies, named)
    # The differences fill the plot: the points spread over most of it, both ways.
    xs = [(b[0] + b[2]) / 2 for b in g["points"]]
    ys = [(b[1] + b[3]) / 2 for b in g["points"]]
    assert max(xs) - min(xs) >= 0.6 * width, (xs, width)
    assert max(ys) - min(ys) >= 0.6 * height, (ys, height)
    assert round_ticks(g["xticks"]) and round_ticks(g["yticks"]), (g["xticks"], g["yticks"])


def test_the_measurement_sees_overlapping_labels_and_unround_ticks(tmp_path):
    # The negative control of the geometry above: a chart with two labels on top of each other and
    # ticks of 1.78 MiB is caught by the same measurement.
    page = tmp_path / "bad.html"
    page.write_text("""<html><body><svg class="bench-chart" width="400" height="300">
<rect class="plot" x="50" y="10" width="300" height="250"/>
<text class="label" x="100" y="100">every:2</text><text class="label" x="104" y="102">segments:sqrt</text>
<text class="tick" text-anchor="middle" x="60" y="280">1.78</text><text class="tick" text-anchor="middle" x="120" y="280">3.57</text>
<text class="tick" text-anchor="middle" x="180" y="280">5.35</text>
</svg></body></html>""")
    g = geometry(page, tmp_path)
    assert overlapping(g["labels"]) == [("every:2", "segments:sqrt")]
    assert not round_ticks(g["xticks"])


def test_the_plan_chart_as_a_browser_lays_it_out(ckcheck, tmp_path):
    # none, a plan that fails its checks (crossed out) and the plan recommended, with the budget line.
    html = tmp_path / "plan.html"
    r = ckcheck("plan", "--model", "faulty/inplace-input", "--layers", "4", "--hidden", "64", "--batch", "64",
                "--fault-site", "0", "--memory-budget", "850KiB", "--steps", "3", "--warmup", "1", "--time-budget", "3",
                "--report", f"html={html}", "--report", f"json={tmp_path / 'plan.json'}")
    assert r.code == 0, r.out + r.err
    plan = json.loads((tmp_path / "plan.json").read_text())["plan"]
    assert len(plan["attempts"]) == 2, plan["attempts"]
    g = geometry(html, tmp_path)
    plot = g["plot"]
    assert not overlapping(g["labels"]), overlapping(g["labels"])
    for label in g["labels"]:
        x0, y0, x1, y1 = label["box"]
        assert plot[0] <= x0 and x1 <= plot[2] and plot[1] <= y0 and y1 <= plot[3], label
    # A plan whose checkpointed step throws is not measured: no point for it.
    measured = [p for p in plan["measured"]["policies"] if p["peak_bytes"] is not None]
    assert len(g["points"]) == len(measured) >= 2
    named = " ".join(label["text"] for label in g["labels"])
    assert "memory budget" in named and plan["recommendation"] in named, named
    assert round_ticks(g["xticks"]) and round_ticks(g["yticks"]), (g["xticks"], g["yticks"])

