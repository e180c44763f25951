"""``numerics.png``: the mismatch report as four panels (matplotlib, headless, lazy import).

Panels: |delta log-prob| histogram per comparison (token share per bin), mean |delta| by
position bucket, mean |delta| by token-frequency bucket, and k3 per comparison (log scale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollbank.extras import require

FEATURE = "the numerics plot"


def _pyplot() -> Any:
    require("matplotlib", "report", FEATURE).use("Agg")
    return require("matplotlib.pyplot", "report", FEATURE)


def _shown(report: dict[str, Any]) -> list[str]:
    """Trainer-vs-engine comparisons first, then the rest (at most 8 lines per panel)."""
    names = list(report["comparisons"])
    names.sort(key=lambda n: (not report["comparisons"][n]["candidate"].startswith("trainer-")
                              or report["comparisons"][n]["reference"].startswith("trainer-")))
    return names[:8]


def plot_report(report: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    comps = report["comparisons"]
    names = _shown(report)
    fig, axes = plt.subplots(2, 2, figsize=(15, 10))
    ax = axes[0][0]
    for name in names:
        hist = comps[name]["histogram"]
        total = max(sum(hist.values()), 1)
        ax.plot(range(len(hist)), [v / total for v in hist.values()], marker="o", label=name)
    first = comps[names[0]]["histogram"] if names else {}
    ax.set_xticks(range(len(first)), list(first), rotation=45, fontsize=7)
    ax.set_title("|delta log-prob| (nats): share of tokens per bin")
    ax.legend(fontsize=6)
    for ax, key, title in ((axes[0][1], "by_position", "mean |delta| by position"),
                           (axes[1][0], "by_frequency", "mean |delta| by token frequency in the corpus")):
        for name in names:
            groups = comps[name][key]
            ax.plot(list(groups), [g["mean"] for g in groups.values()], marker="o", label=name)
        ax.set_yscale("symlog", linthresh=1e-6)
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=7)
    ax = axes[1][1]
    k3 = [max(comps[n]["abs"]["k3"], 1e-12) for n in names]
    ax.barh(range(len(names)), k3)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.set_xscale("log")
    ax.set_title("mismatch k3 KL (nats/token)")
    fig.suptitle(f"rollbank numerics: {report['model']}, {report['sampled_tokens']} sampled tokens, "
                 f"behaviour = {report['behaviour']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
