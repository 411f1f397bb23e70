"""Figure 15 and Tables 12 and 13 of the paper (`PAPER`), and ours beside them (`fig15.py`'s
table.md and fig15.png): test loss against inference cost for models of about equal total size;
and their rows of the paper table, read from the committed results.json (PAPER_ROWS).
"""

from __future__ import annotations

from soma_jax.studies import paper, report, results

PAPER = {
    "item": "Figure 15, Tables 12 and 13",
    "figure15": "More shards reduce inference cost, but training progress changes their "
                "ranking. Left, the four settings from Figure 1 at 100 estimated training "
                "GPU-hours, with losses interpolated between checkpoints. Right, recorded N=1,2,256 "
                "checkpoints at 152, 150, and 41.9k estimated training GPU-hours, using the "
                "recorded-update accounting in Table 3. Their training budgets differ. Both "
                "panels use the same test set. Bars show 95% document-bootstrap intervals and "
                "exclude interpolation uncertainty on the left. Arithmetic operations count the "
                "selected experts and exclude routing. Parameter counts and arithmetic "
                "operations follow Sections 3 and 7.",
    "table12": {
        "caption": "Complete warm inference at the fastest validated settings, including "
                   "routing when needed. Each token is one byte, with 768 evaluated tokens per "
                   "1,024-byte request. Values are medians of seven repetitions on the same GPU. "
                   "Peak allocated memory includes intermediates. Compilation and warmup are "
                   "excluded.",
        "rows": [
            {"model": "Monolithic SPSA", "n_experts": 1, "batch": 768,
             "throughput_m_tokens_per_s": 0.555, "batch_latency_ms": 1060, "peak_gpu_gib": 16.5},
            {"model": "SOMA N=2", "n_experts": 2, "batch": 768,
             "throughput_m_tokens_per_s": 0.468, "batch_latency_ms": 1260, "peak_gpu_gib": 12.3},
            {"model": "SOMA N=8", "n_experts": 8, "batch": 1024,
             "throughput_m_tokens_per_s": 0.257, "batch_latency_ms": 3060, "peak_gpu_gib": 15.0},
            {"model": "SOMA N=256", "n_experts": 256, "batch": 4096,
             "throughput_m_tokens_per_s": 2.36, "batch_latency_ms": 1330, "peak_gpu_gib": 8.30},
        ]},
    "table13": {
        "caption": "Test loss and training budgets for the approximately equal-total-size "
                   "inference comparison. All rows use top-k routing with k=4. The SOMA N=8 and "
                   "later SOMA N=256 checkpoints are timed in Table 12. The middle row supplies "
                   "the nearest measured SOMA N=256 checkpoint to the training duration of SOMA "
                   "N=8. Wall-clock and aggregate time retain the accounting used in Figure 1, "
                   "excluding initialization, evaluation and checkpointing.",
        "rows": [
            {"model": "SOMA N=8", "n_experts": 8, "params": "8.55M", "updates": "53.5k–70.0k",
             "wall_clock_hours": 104, "gpu_hours": "700", "test": 1.71},
            {"model": "SOMA N=256", "n_experts": 256, "params": "8.44M", "updates": "2.18M",
             "wall_clock_hours": 100, "gpu_hours": "22.0k", "test": 1.75},
            {"model": "SOMA N=256", "n_experts": 256, "params": "8.44M", "updates": "4.16M",
             "wall_clock_hours": 191, "gpu_hours": "41.9k", "test": 1.68},
        ]},
}


def _label(n: int) -> str:
  return "Monolithic SPSA" if n == 1 else f"SOMA N={n}"


def plot(p: dict, path: str) -> None:
  """fig15.png: test loss against inference operations per token (left) and against measured
  throughput at the fastest batch (right), bars the 95% document-bootstrap intervals."""
  from matplotlib.ticker import NullFormatter

  m = p["measured"]
  fig, axes = report.plt.subplots(1, 2, figsize=(10, 4))
  spans = [[], []]
  for name, r in m["rows"].items():
    t = m["inference"]["rows"][name]
    y, (lo, hi) = r["test"]["nats_per_byte"], r["test"]["ci95"]
    for i, x in enumerate((t["ops_per_token"] / 1e6, t["fastest"]["tokens_per_second"] / 1e6)):
      axes[i].errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="o", capsize=3,
                       label=f"{_label(r['n_experts'])} ({r['params']:,} params)")
      spans[i].append(x)
  axes[0].set_xlabel("inference operations per token, millions (selected experts, no routing)")
  axes[1].set_xlabel("measured throughput at the fastest batch (M scored tokens/s)")
  for ax, xs in zip(axes, spans, strict=True):
    if max(xs) > 10 * min(xs):  # a log axis where the costs span a decade (a labelled one)
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("test loss (nats/byte)")
    ax.legend(fontsize=7)
  fig.suptitle("equal total size: test loss against inference cost (bars: 95% document "
               "bootstrap)", fontsize=9)
  report.save_figure(fig, path)


def _paper12(n: int | None) -> str:
  r = next((r for r in PAPER["table12"]["rows"] if r["n_experts"] == n), None)
  if r is None:
    return "- | - | - | -"
  return (f"{r['model']}: {r['batch']:,} | {r['throughput_m_tokens_per_s']:g} | "
          f"{r['batch_latency_ms']:,} | {r['peak_gpu_gib']:.3g} GiB")


def _paper13(n: int | None) -> str:
  found = [r for r in PAPER["table13"]["rows"] if r["n_experts"] == n]
  if not found:
    return "-"
  return " ; ".join(f"{r['model']}: {r['params']}, {r['updates']} updates, "
                    f"{r['wall_clock_hours']} h, {r['gpu_hours']} GPU-h, {r['test']}"
                    for r in found)


def table(p: dict) -> str:
  """Markdown: Table 12 and Table 13 in the paper's layout, ours beside the paper's."""
  m, b, e = p["measured"], p["budget"], p["eval"]
  inf, paper_n = m["inference"], m["paper_rows"]
  load = inf["load_average"]
  lines = [f"Figure 15 / Tables 12-13 at this scale: rows of about equal total size, each "
           f"continuing its width's seed run ({b['seed_updates']} updates), "
           f"{b['amount']:.4g} training operations per row and seed ({b['reference_updates']:g} "
           f"updates of {p['reference']}), seeds {p['seeds']}; test on "
           f"{e['test_windows']} pieces of {e['window_bytes']} bytes from "
           f"{e['test_documents']} documents (route {e['route_bytes']}, score "
           f"{e['score_bytes']}).", "",
           f"Table 12: complete warm inference at the fastest batch of each row, routing "
           f"included where N > 1, median of {next(iter(inf['rows'].values()))['repeats']} "
           f"repetitions, compilation and warm-up excluded; a request is one "
           f"{e['window_bytes']}-byte piece ({e['route_bytes'] + e['score_bytes']} input bytes) "
           f"with {e['score_bytes']} scored tokens counted (the paper: 1,024-byte requests, "
           f"768). Machine: {inf['machine']['platform']}, "
           f"{inf['machine']['cpu_count']} CPUs, backend {inf['machine']['backend']}; load "
           f"average {load['start'][0]:.2f} before timing, {load['end'][0]:.2f} after. Peak: "
           "XLA's plan of the largest scoring program plus the host mixture arrays.", "",
           *results.head("| model | batch | throughput (M tokens/s) | batch latency (ms) | peak "
                         "(MiB) | ops / token | paper: batch | throughput | latency (ms) | peak "
                         "GPU memory |")]
  for name, r in m["rows"].items():
    t = inf["rows"][name]
    f = t["fastest"]
    peak = "-" if f["planned_peak_bytes"] is None else f"{f['planned_peak_bytes'] / 2**20:.3g}"
    lines.append(f"| {_label(r['n_experts'])} | {f['batch']:,} | "
                 f"{f['tokens_per_second'] / 1e6:.3g} | {f['batch_latency_ms']:,.1f} | {peak} | "
                 f"{t['ops_per_token']:,} | {_paper12(paper_n.get(name))} |")
  lines += ["", "Table 13: test loss (top-min(4, N), 95% document bootstrap) and training "
            "budgets; training seconds exclude the seed run, initialisation, evaluation and "
            "checkpoints.", "",
            *results.head("| model | parameters | updates | training wall seconds | training "
                          "device-seconds | test loss | paper |")]
  for name, r in m["rows"].items():
    lo, hi = r["test"]["ci95"]
    lines.append(f"| {_label(r['n_experts'])} (width {r['d_t']}) | {r['params']:,} | "
                 f"{r['updates']['mean']:g} | {r['update_seconds']['mean']:.1f} | "
                 f"{r['device_seconds']['mean']:.1f} | {r['test']['nats_per_byte']:.4f} "
                 f"[{lo:.4f}, {hi:.4f}] (start {r['start_test']['nats_per_byte']:.4f}) | "
                 f"{_paper13(paper_n.get(name))} |")
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the paper table's rows

def ours_figure15(d: dict) -> str:
  m = d["measured"]  # ops per token count the routed experts, as the paper's
  return "; ".join(f"N = {r['n_experts']}: test {r['test']['nats_per_byte']:.4f} at "
                   f"{m['inference']['rows'][n]['ops_per_token'] / 1e6:.2f}M ops per token"
                   for n, r in m["rows"].items()) + " (top-min(4, N), selected experts)"


def ours_table12(d: dict) -> str:
  t = d["measured"]["inference"]
  names = {"mono": "monolith", "soma_n2": "N = 2", "soma_n8": "N = 8", "soma_n32": "N = 32"}
  return "; ".join(f"{names.get(n, n)}: {r['fastest']['tokens_per_second'] / 1e6:.4f} M tokens/s "
                   f"at batch {r['fastest']['batch']}" for n, r in t["rows"].items())


def ours_table13(d: dict) -> str:
  return "; ".join(f"N = {r['n_experts']} (width {r['d_t']}): {r['test']['nats_per_byte']:.4f}"
                   f" after {r['updates']['mean']:.0f} updates"
                   for r in d["measured"]["rows"].values()) + " (test, top-min(4, N))"


PAPER_ROWS = (
    paper.StudyRow(
        "Figure 15", "inference cost against loss at equal total size", ours_figure15, "more "
        "shards reduce inference cost; training progress changes the ranking", "1.06M params, N "
        "up to 32 (paper 256), one seed, 3.2e12 operations per row",
        brief="N = 32 cheapest per token", paper_brief="more shards cheaper",
        no_verdict="one seed"),
    paper.StudyRow(
        "Table 12", "complete warm inference at the fastest batch", ours_table12, "0.555 / 0.468 "
        "/ 0.257 / 2.36 M tokens/s (monolith, N = 2, 8, 256; one GPU)", "2 CPU cores; 192 scored "
        "tokens per 257-byte request (paper 768 of 1,024)",
        brief="N = 32 fastest, N = 2 and 8 below the monolith", paper_brief="N = 256 fastest",
        no_verdict="one timing on one machine"),
    paper.StudyRow(
        "Table 13", "test loss and budgets of the inference comparison", ours_table13, "N = 8 "
        "1.71; N = 256 1.75 and 1.68 (top-4)", "one budget in operations for every row (paper: "
        "budgets differ per row)", brief="N = 8 lowest", paper_brief="N = 256 1.68",
        no_verdict="one seed"),
)
