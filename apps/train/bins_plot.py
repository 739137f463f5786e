"""HeteroSpec's fidelity check (§3.2) as a self-contained SVG: where the accepted paths' Terminal
Confidence Ranks fall among the verified candidates, and how long each entropy bin's accepted
paths are. Drawn from the rows `apps.train bins --save-paths` writes and the fitted bins.
"""

from __future__ import annotations

import numpy as np

W, H, PAD = 360, 240, 40


def _bars(
    values: list[float], labels: list[str], title: str, x0: int, highlight: int = 0
) -> list[str]:
    top = max(max(values), 1e-9)
    bw = (W - 2 * PAD) / max(1, len(values))
    out = [f'<text x="{x0 + W / 2}" y="16" text-anchor="middle" font-weight="bold">{title}</text>']
    for i, (v, lab) in enumerate(zip(values, labels, strict=True)):
        h = (H - 2 * PAD) * v / top
        x = x0 + PAD + i * bw
        color = "#d62728" if i < highlight else "#1f77b4"
        out.append(
            f'<rect x="{x + 1:.1f}" y="{H - PAD - h:.1f}" width="{bw - 2:.1f}" '
            f'height="{h:.1f}" fill="{color}"/>'
        )
        out.append(
            f'<text x="{x + bw / 2:.1f}" y="{H - PAD + 14}" text-anchor="middle">{lab}</text>'
        )
        out.append(
            f'<text x="{x + bw / 2:.1f}" y="{H - PAD - h - 3:.1f}" '
            f'text-anchor="middle">{v:.2g}</text>'
        )
    return out


def fidelity_svg(tcr: np.ndarray, accepted: np.ndarray, phi: np.ndarray, bins: dict) -> str:
    """Left: share of accepted paths per TCR (the top quartile of top-N in red). Right: mean
    accepted length per entropy bin (bin 0 = lowest Φ; the extended bins in red)."""
    n = int(bins.get("top_n", max(tcr.max(), 1)))
    share = [float((tcr == r).mean()) for r in range(1, n + 1)]
    b = np.searchsorted(np.array(bins["thresholds"]), phi, side="right")
    nb = len(bins["thresholds"]) + 1
    mean_len = [float(accepted[b == i].mean()) if (b == i).any() else 0.0 for i in range(nb)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * W}" height="{H}" '
        'font-family="sans-serif" font-size="10">'
    ]
    parts += _bars(
        share, [str(r) for r in range(1, n + 1)], "accepted paths by TCR", 0, max(1, n // 4)
    )
    parts += _bars(mean_len, [f"B{i}" for i in range(nb)], "mean accepted length by bin", W, 3)
    parts.append("</svg>")
    return "\n".join(parts)
