"""The sweep's line chart as a self-contained HTML page: FF against κ (log2 axis), one line per ℓe.

Solid lines with dots are the measured FF; the dashed line of the same color is
that ℓe's 1 - Ω_κ, App. E's upper bound on FF.
"""

from __future__ import annotations

import html
import math

from .picture import figures_table, page

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H, L, R, T, B = 640, 400, 60, 150, 20, 50  # size and margins (px)


def sweep_svg(rows: list[dict]) -> str:
    kappas = sorted({r["kappa"] for r in rows})
    les = sorted({r["exit_layer"] for r in rows})
    lo, hi = math.log2(kappas[0]), math.log2(kappas[-1])
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    x = lambda k: L + (math.log2(k) - lo) / (hi - lo) * (W - L - R)  # noqa: E731
    y = lambda v: T + (1 - v) * (H - T - B)  # noqa: E731  FF and 1-Ω_κ are in [0, 1]
    out = [f'<svg width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" '
           'fill="none" stroke="#333"/>']  # fmt: skip
    for v in (0, 0.25, 0.5, 0.75, 1):
        out.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    for k in kappas:
        out.append(
            f'<line x1="{x(k):.1f}" y1="{H - B}" x2="{x(k):.1f}" y2="{H - B + 5}" stroke="#333"/>'
        )
        out.append(f'<text x="{x(k):.1f}" y="{H - B + 18}" text-anchor="middle">{k}</text>')
    out.append(
        f'<text x="{(L + W - R) / 2}" y="{H - 8}" text-anchor="middle">κ (log2 scale)</text>'
    )
    out.append(
        f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(T + H - B) / 2})">fallback frequency FF</text>'
    )
    for n, le in enumerate(les):
        c = COLORS[n % len(COLORS)]
        pts = [r for r in sorted(rows, key=lambda r: r["kappa"]) if r["exit_layer"] == le]
        for key, dash in (("ff", ""), ("one_minus_omega", ' stroke-dasharray="6 4"')):
            xy = [(x(r["kappa"]), y(r[key])) for r in pts if r[key] is not None]
            if xy:
                path = " ".join(f"{a:.1f},{b:.1f}" for a, b in xy)
                out.append(
                    f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"{dash}/>'
                )
        for r in pts:
            if r["ff"] is not None:
                tip = (
                    f"ℓe={le}, κ={r['kappa']}: FF {r['ff']:.3f}, 1-Ω_κ "
                    f"{r['one_minus_omega']:.3f}, {r['steps']} steps"
                )
                out.append(
                    f'<circle cx="{x(r["kappa"]):.1f}" cy="{y(r["ff"]):.1f}" r="4" fill="{c}">'
                    f"<title>{html.escape(tip)}</title></circle>"
                )
        ly = T + 10 + n * 36
        out.append(
            f'<line x1="{W - R + 12}" y1="{ly}" x2="{W - R + 36}" y2="{ly}" stroke="{c}" '
            'stroke-width="2"/>'
        )
        out.append(f'<text x="{W - R + 40}" y="{ly + 4}">FF, ℓe={le}</text>')
        out.append(
            f'<line x1="{W - R + 12}" y1="{ly + 16}" x2="{W - R + 36}" y2="{ly + 16}" stroke="{c}" '
            f'stroke-width="2" stroke-dasharray="6 4"/>'
        )
        out.append(f'<text x="{W - R + 40}" y="{ly + 20}">1-Ω_κ, ℓe={le}</text>')
    out.append("</svg>")
    return "\n".join(out)


def sweep_page(rows: list[dict], info: dict, title: str) -> str:
    body = (
        figures_table(list(info.items()))
        + "<p>Mirror-SD App. E, Fig. 7: FF against κ per exit layer; dashed: the bound 1 − Ω_κ. "
        "Hover a dot for its figures.</p>" + sweep_svg(rows)
    )
    return page(title, body)
