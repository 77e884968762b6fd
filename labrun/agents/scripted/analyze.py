"""Analyse the noise-averaging results: slope against theory, gaps per k, and a plot."""

import csv
import json
import math
from pathlib import Path

RESULTS = Path("results")
TOLERANCE = 0.05


def svg_plot(rows, path):
    """log-log RMSE against k, one polyline per noise, with the theory line dashed."""
    w, h, pad = 480, 320, 40
    ks = sorted({int(r["k"]) for r in rows})
    values = [float(r["rmse"]) for r in rows] + [float(r["theoretical_rmse"]) for r in rows]
    lx = lambda k: pad + (w - 2 * pad) * math.log(k) / math.log(ks[-1])
    lo, hi = math.log(min(values)), math.log(max(values))
    ly = lambda v: h - pad - (h - 2 * pad) * (math.log(v) - lo) / (hi - lo)
    lines = []
    for noise, colour in (("gaussian", "#1f77b4"), ("uniform", "#d62728")):
        pts = " ".join(f"{lx(int(r['k'])):.1f},{ly(float(r['rmse'])):.1f}" for r in rows if r["noise"] == noise)
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"/>')
    theory = " ".join(f"{lx(int(r['k'])):.1f},{ly(float(r['theoretical_rmse'])):.1f}" for r in rows if r["noise"] == "gaussian")
    lines.append(f'<polyline fill="none" stroke="#333" stroke-dasharray="4 3" points="{theory}"/>')
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
        f'<text x="{pad}" y="20">RMSE vs k (log-log); dashed: sigma/sqrt(k)</text>'
        + "".join(lines) + "</svg>\n"
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
