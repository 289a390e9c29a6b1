#!/usr/bin/python3
"""Figures of `lbbsp report`: one or more runs' telemetry (--log-dir folders) side by side.

usage: runtime/cli/report_figures.py [--png DIR] [--html DIR --markdown REPORT.md] RUN_DIR [RUN_DIR ...]
Writes iteration_time.png (every run's iteration time on one axis), batch_split.png (per-rank share of the
global batch over the iterations, one panel per run) and wait.png (per-rank time waiting at the barrier, one bar
per run) into each folder given; --html also writes report.html: the markdown report with the figures.
`lbbsp report --png DIR / --html DIR` runs this after checking the runs; docs/report.md describes the figures.
"""
import argparse
import html
import os
import re
import sys

import h5py
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

FIELDS = ["iteration", "rank", "batch", "compute_s", "wait_s", "allreduce_s", "balancer_s"]


def load(run_dir):
    path = os.path.join(run_dir, "telemetry.h5")
    try:
        with h5py.File(path, "r") as f:
            g = f["records"]
            cols = {k: g[k][:] for k in FIELDS}
            attrs = {k: (v.decode() if isinstance(v, bytes) else str(v)) for k, v in g.attrs.items()}
    except (OSError, KeyError) as e:
        sys.exit(f"report_figures.py: cannot read '{path}': {e}")
    ranks = int(attrs.get("ranks", cols["rank"].max() + 1))
    n = len(cols["iteration"]) // ranks
    grid = {k: cols[k][: n * ranks].reshape(n, ranks) for k in FIELDS}  # rows in (iteration, rank) order
    name = os.path.basename(os.path.normpath(run_dir))
    balancer = attrs.get("balancer", "?")
    predictor = attrs.get("predictor", "") if balancer == "lbbsp-cpu" else ""
    if balancer in name:  # a folder named after its balancer: add only the predictor
        label = name + (f" ({predictor})" if predictor and predictor not in name else "")
    else:
        label = f"{name} ({balancer}{'/' + predictor if predictor else ''})"
    return {"name": name, "label": label, "ranks": ranks,
            "iteration": grid["iteration"][:, 0], "batch": grid["batch"], "wait": grid["wait_s"],
            "time": grid["compute_s"].max(axis=1) + grid["allreduce_s"][:, 0] + grid["balancer_s"][:, 0],
            "model": attrs.get("model", "?"), "global_batch": attrs.get("global_batch", "?")}


def rolling_mean(v, window):
    if len(v) < window:
        return v
    c = np.cumsum(np.insert(v.astype(float), 0, 0.0))
    out = (c[window:] - c[:-window]) / window
    return np.concatenate([np.full(window - 1, np.nan), out])


def iteration_time(runs, path):
    window = max(1, min(20, len(runs[0]["time"]) // 20))
    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    top = 0.0
    for r in runs:
        smooth = rolling_mean(r["time"], window)
        line = ax.plot(r["iteration"], 1e3 * r["time"], lw=0.6, alpha=0.35)
        ax.plot(r["iteration"], 1e3 * smooth, lw=1.8, color=line[0].get_color(), label=r["label"])
        top = max(top, np.nanmax(smooth), np.percentile(r["time"], 99))
    clipped = any(r["time"].max() > 1.2 * top for r in runs)
    ax.set(xlabel="iteration", ylabel="iteration time (ms)",
           title=f"Iteration time (thin: each iteration, thick: mean of {window})"
           + ("; the few slowest go off the top" if clipped else ""))
    ax.set_ylim(0, 1e3 * top * 1.2 if clipped else None)
    ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def batch_split(runs, path):
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.2 + 2.4 * len(runs)), sharex=True, squeeze=False,
                             layout="constrained")
    for ax, r in zip(axes[:, 0], runs):
        labels = [f"rank {k}" for k in range(r["ranks"])] if r["ranks"] <= 16 else None
        ax.stackplot(r["iteration"], r["batch"].T, labels=labels, lw=0)
        ax.set(ylabel="samples", title=f"{r['label']}: batch per rank (global batch {r['global_batch']})")
        ax.margins(x=0, y=0)
        if labels:  # beside the panel, where constrained layout keeps it inside the image
            handles, names = ax.get_legend_handles_labels()  # top of the stack first
            ax.legend(handles[::-1], names[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    axes[-1, 0].set_xlabel("iteration")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def wait_bars(runs, path):
    ranks = runs[0]["ranks"]
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(6, min(14, 1.2 + 0.6 * ranks * len(runs))), 4), layout="constrained")
    x = np.arange(ranks)
    for i, r in enumerate(runs):
        total = r["wait"].sum(axis=0)
        ax.bar(x + (i - (len(runs) - 1) / 2) * width, total, width, label=f"{r['label']}: {total.sum():.1f} s")
    ax.set(xlabel="rank", ylabel="seconds waiting", title="Time each rank waited for the slowest at the barrier")
    ax.set_xticks(x)
    ax.legend(fontsize=8, title="run: all ranks together", title_fontsize=8, loc="best")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_to_html(text):
    """The report's markdown (headings, lists, pipe tables, `code`) as HTML."""
    def inline(s):
        return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(s))

    out, table, in_list = [], [], False
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                table.append(cells)
            continue
        if table:
            out.append("<table><tr>" + "".join(f"<th>{inline(c)}</th>" for c in table[0]) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in table[1:]]
            out.append("</table>")
            table = []
        if in_list and not line.startswith("- "):
            out.append("</ul>")
            in_list = False
        m = re.match(r"(#+) (.*)", line)
        if m:
            n = len(m.group(1))
            out.append(f"<h{n}>{inline(m.group(2))}</h{n}>")
        elif line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    return "\n".join(out)


def write_html(folder, markdown_path):
    with open(markdown_path) as f:
        body = markdown_to_html(f.read())
    figures = "".join(f'<p><img src="{n}" alt="{n}"></p>\n'
                      for n in ["iteration_time.png", "batch_split.png", "wait.png"])
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}img{max-width:100%}")
    with open(os.path.join(folder, "report.html"), "w") as f:
        f.write(f"<!doctype html><html><head><meta charset='utf-8'><title>lbbsp report</title>"
                f"<style>{style}</style></head><body>\n{body}\n<h2>Figures</h2>\n{figures}</body></html>\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--png", help="folder for the PNG figures")
    ap.add_argument("--html", help="folder for report.html and its figures")
    ap.add_argument("--markdown", help="the markdown report to put into report.html")
    a = ap.parse_args()
    if not a.png and not a.html:
        ap.error("give --png DIR or --html DIR")
    if a.html and not a.markdown:
        ap.error("--html needs --markdown REPORT.md (lbbsp report --html DIR passes it)")
    runs = [load(d) for d in a.runs]
    if len({r["name"] for r in runs}) < len(runs):  # as lbbsp report: parent/name when folder names repeat
        for r, d in zip(runs, a.runs):
            parent = os.path.basename(os.path.dirname(os.path.normpath(d)))
            r["label"] = r["label"].replace(r["name"], f"{parent}/{r['name']}", 1)
    for folder in [d for d in (a.png, a.html) if d]:
        os.makedirs(folder, exist_ok=True)
        iteration_time(runs, os.path.join(folder, "iteration_time.png"))
        batch_split(runs, os.path.join(folder, "batch_split.png"))
        wait_bars(runs, os.path.join(folder, "wait.png"))
        if folder == a.html:
            write_html(folder, a.markdown)
        print(f"figures in {folder}: iteration_time.png batch_split.png wait.png"
              + (" report.html" if folder == a.html else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
