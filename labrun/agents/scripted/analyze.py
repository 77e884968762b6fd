"""Analyse the noise-averaging results: slope against theory, gaps per k, and a plot."""

import csv
import json
import math
from pathlib import Path

RESULTS = Path("results")
TOLERANCE = 0.05


def svg_plot(rows, path):
    """log-log RMSE against k, one line per noise and the theory dashed, with axes, ticks,
    their labels and a legend."""
    w, h, left, right, top, bottom = 560, 360, 70, 150, 30, 50
    ks = sorted({int(r["k"]) for r in rows})
    values = [float(r["rmse"]) for r in rows] + [float(r["theoretical_rmse"]) for r in rows]
    lo, hi = math.log10(min(values)), math.log10(max(values))
    lx = lambda k: left + (w - left - right) * math.log(k) / math.log(ks[-1])
    ly = lambda v: h - bottom - (h - top - bottom) * (math.log10(v) - lo) / (hi - lo)
    x0, x1, y0, y1 = left, w - right, h - bottom, top
    parts = [f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>',
             f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>']
    for k in ks:  # x ticks: each k measured
        x = lx(k)
        parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 5}" stroke="black"/>'
                     f'<text x="{x:.1f}" y="{y0 + 18}" font-size="11" text-anchor="middle">{k}</text>')
    ticks = [m * 10 ** e for e in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in (1, 2, 5)]
    for v in [t for t in ticks if lo <= math.log10(t) <= hi]:  # y ticks: 1, 2, 5 per decade
        y = ly(v)
        parts.append(f'<line x1="{x0 - 5}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}" stroke="black"/>'
                     f'<text x="{x0 - 8}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{v:g}</text>')
    parts.append(f'<text x="{(x0 + x1) / 2}" y="{h - 12}" font-size="13" text-anchor="middle">'
                 'k, measurements averaged (log scale)</text>')
    parts.append(f'<text x="18" y="{(y0 + y1) / 2}" font-size="13" text-anchor="middle" '
                 f'transform="rotate(-90 18 {(y0 + y1) / 2})">RMSE (log scale)</text>')
    series = [("gaussian", "#1f77b4", "", "rmse", "Gaussian noise"),
              ("uniform", "#d62728", "", "rmse", "uniform noise"),
              ("gaussian", "#333", ' stroke-dasharray="4 3"', "theoretical_rmse", "sigma/sqrt(k)")]
    for i, (noise, colour, dash, column, label) in enumerate(series):
        pts = " ".join(f"{lx(int(r['k'])):.1f},{ly(float(r[column])):.1f}" for r in rows if r["noise"] == noise)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{pts}"/>')
        y = top + 10 + 20 * i  # the legend, right of the plot
        parts.append(f'<line x1="{x1 + 15}" y1="{y}" x2="{x1 + 40}" y2="{y}" stroke="{colour}" stroke-width="2"{dash}/>'
                     f'<text x="{x1 + 45}" y="{y + 4}" font-size="12">{label}</text>')
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">'
        f'<rect width="100%" height="100%" fill="white"/>'  # readable on a dark page too (the Prefect UI's)
        f'<text x="{left}" y="18" font-size="14">RMSE of the mean of k noisy measurements</text>'
        + "".join(parts) + "</svg>\n"
    )


def main():
    metrics = json.loads((RESULTS / "metrics.json").read_text())
    with open(RESULTS / "rmse_by_k.csv") as f:
        rows = list(csv.DictReader(f))
    lines = ["# Analysis", "", "| noise | fitted slope | distance from -0.5 | within ±0.05 | largest gap to theory |",
             "|---|---|---|---|---|"]
    verdicts = {}
    for noise in ("gaussian", "uniform"):
        slope = metrics[f"slope_{noise}"]
        ok = abs(slope + 0.5) <= TOLERANCE
        verdicts[noise] = ok
        lines.append(f"| {noise} | {slope:.4f} | {abs(slope + 0.5):.4f} | {'yes' if ok else 'no'} "
                     f"| {metrics[f'max_rel_gap_{noise}']:.1%} |")
    lines += ["", "| noise | k | RMSE | sigma/sqrt(k) |", "|---|---|---|---|"]
    lines += [f"| {r['noise']} | {r['k']} | {float(r['rmse']):.4f} | {float(r['theoretical_rmse']):.4f} |" for r in rows]
    (RESULTS / "analysis.md").write_text("\n".join(lines) + "\n")
    svg_plot(rows, RESULTS / "rmse_vs_k.svg")
    print(json.dumps({"slopes_within_tolerance": verdicts, **metrics}))


if __name__ == "__main__":
    main()
