#!/usr/bin/env python3
"""Side-by-side plots of a `scripts/compare` serving run (gnuplot, Debian's gnuplot-nox).

    python3 scripts/bench/compare_plots.py DIR [--out PNG_DIR]

For every model in DIR (its <model>-<workload>-<server>.json files) writes
  <model>-ttft-cdf.png   TTFT CDFs of inferd and llama-server, one panel per workload
  <model>-sweep.png      output tokens/s against TTFT p99 over the concurrency sweep, both servers
into PNG_DIR (default DIR/plots).
"""
import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

SERVERS = ("inferd", "llama-server")


def cdf_rows(result):
    ttfts = sorted(r["ttft"] * 1000 for r in result["requests"] if r["success"])
    n = len(ttfts)
    return [(t, (i + 1) / n) for i, t in enumerate(ttfts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or args.dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    runs = {}  # model -> workload -> server -> result
    for f in sorted(args.dir.glob("*.json")):
        m = re.match(r"(.+)-(scenario_[a-z]+(?:@[a-z]+)?|shared-prefix(?:@[a-z]+)?|sweep)-(inferd|llama-server)\.json$",
                     f.name)
        if m:
            runs.setdefault(m.group(1), {}).setdefault(m.group(2), {})[m.group(3)] = json.loads(f.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model, workloads in runs.items():
            panels = [w for w in workloads if w != "sweep" and all(s in workloads[w] for s in SERVERS)]
            gp = ["set terminal pngcairo size 1200,800 font ',10' noenhanced", "set grid", "set key right bottom",
                  f"set output '{out / (model + '-ttft-cdf.png')}'",
                  f"set multiplot layout {(len(panels) + 2) // 3},3 title '{model}: TTFT CDF, inferd vs llama-server'"]
            for w in panels:
                files = []
                for s in SERVERS:
                    path = tmp / f"{model}-{w}-{s}.dat"
                    path.write_text("".join(f"{t} {p}\n" for t, p in cdf_rows(workloads[w][s])))
                    files.append(f"'{path}' using 1:2 with steps lw 2 title '{s}'")
                gp += [f"set title '{w.replace('_', ':')}'", "set xlabel 'TTFT (s)'", "set ylabel 'share'",
                       "plot " + ", ".join(f.replace("using 1:2", "using ($1/1000):2") for f in files)]
            gp.append("unset multiplot")
            if "sweep" in workloads and all(s in workloads["sweep"] for s in SERVERS):
                files = []
                for s in SERVERS:
                    path = tmp / f"{model}-sweep-{s}.dat"
                    path.write_text("".join(f"{p['output_throughput']} {p['p99_ttft_ms'] / 1000} c={p['max_concurrency']}\n"
                                            for p in workloads["sweep"][s]["sweep"]))
                    files.append(f"'{path}' using 1:2 with linespoints lw 2 pt 7 title '{s}', "
                                 f"'{path}' using 1:2:3 with labels offset 1,1 notitle")
                gp += ["set terminal pngcairo size 900,560 font ',10' noenhanced", f"set output '{out / (model + '-sweep.png')}'",
                       f"set title '{model}: scenario:chat concurrency sweep'", "set key right top",
                       "set xlabel 'output tokens/s'", "set ylabel 'TTFT p99 (s)'", "plot " + ", ".join(files)]
            script = tmp / f"{model}.gp"
            script.write_text("\n".join(gp) + "\n")
            subprocess.run(["gnuplot", str(script)], check=True)
            print(f"compare_plots: {out / (model + '-ttft-cdf.png')}, {out / (model + '-sweep.png')}")


if __name__ == "__main__":
    main()
