"""The Mirror-SD timeline as one self-contained HTML page: inline SVG, inline style, no JS.

Three lanes (target, draft, channel), one rectangle per recorded interval
colored by kind, a hover title with its duration and arguments, and a time
axis in milliseconds. The page scrolls sideways; the scale puts a typical
target step at about STEP_PX pixels.
"""

from __future__ import annotations

import html
import math

from runtime.mirror.timeline import LANES, Timeline

# kind -> (color, legend text); kind_of() maps an interval's name onto these
KINDS = {
    "prefill": ("#9e9e9e", "target prefill"),
    "prefix": ("#1f77b4", "target prefix 1..ℓe + early exit"),
    "suffix": ("#aec7e8", "target suffix ℓe+1..N + verify"),
    "initial": ("#98df8a", "draft initial rollout"),
    "rollout": ("#2ca02c", "draft branch rollout"),
    "fallback": ("#d62728", "draft fallback rollout"),
    "early-exit": ("#ff7f0e", "early-exit message"),
    "final-verify": ("#9467bd", "final-verification message"),
    "window": ("#8c564b", "next window to the target"),
    "other": ("#c7c7c7", "other"),
}
LANE_H, LANE_GAP, LEFT, TOP, AXIS_H = 26, 10, 70, 10, 30
STEP_PX, MIN_W, MAX_W = 120.0, 900, 60000


def kind_of(lane: str, name: str) -> str:
    if lane == "channel":
        return name if name in KINDS else "other"
    for k in ("prefill", "prefix", "suffix", "initial", "fallback", "rollout"):
        if name.startswith(k):
            return k
    return "other"


def _nice_step(span: float, target_ticks: float) -> float:
    """1, 2 or 5 × 10^k, so that span / step is about target_ticks."""
    raw = span / max(target_ticks, 1)
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def _scale(tl: Timeline, span_ms: float) -> float:
    """Pixels per ms: a median target step at STEP_PX, within [MIN_W, MAX_W] overall."""
    steps = sorted(
        i.dur_ns / 1e6
        for i in tl.intervals
        if i.lane == "target" and i.name.startswith(("prefix", "suffix"))
    )
    typical = 2 * steps[len(steps) // 2] if steps else span_ms / 10 or 1.0
    px = STEP_PX / max(typical, 1e-6)
    return min(max(px, MIN_W / max(span_ms, 1e-9)), MAX_W / max(span_ms, 1e-9))


def timeline_svg(tl: Timeline) -> str:
    ivs = sorted(tl.intervals, key=lambda i: i.start_ns)
    t0 = min((i.start_ns for i in ivs), default=tl.origin_ns)
    span_ms = max(((i.end_ns - t0) / 1e6 for i in ivs), default=1.0) or 1.0
    px = _scale(tl, span_ms)
    width = int(LEFT + span_ms * px + 20)
    lanes_h = len(LANES) * (LANE_H + LANE_GAP)
    height = TOP + lanes_h + AXIS_H
    out = [f'<svg width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">']  # fmt: skip
    ys = {}
    for k, lane in enumerate(LANES):
        y = ys[lane] = TOP + k * (LANE_H + LANE_GAP)
        out.append(
            f'<rect x="{LEFT}" y="{y}" width="{width - LEFT}" height="{LANE_H}" fill="#f6f6f6"/>'
        )
        out.append(f'<text x="4" y="{y + LANE_H / 2 + 4}">{lane}</text>')
    for iv in ivs:
        x = LEFT + (iv.start_ns - t0) / 1e6 * px
        w = max(iv.dur_ns / 1e6 * px, 0.75)  # µs messages stay visible
        color = KINDS[kind_of(iv.lane, iv.name)][0]
        args = ", ".join(f"{k} {v}" for k, v in iv.args.items())
        tip = f"{iv.name}: {_fmt_dur(iv.dur_ns)}" + (f" ({args})" if args else "")
        out.append(
            f'<rect x="{x:.2f}" y="{ys[iv.lane]}" width="{w:.2f}" height="{LANE_H}" '
            f'fill="{color}"><title>{html.escape(tip)}</title></rect>'
        )
    y_axis = TOP + lanes_h
    out.append(f'<line x1="{LEFT}" y1="{y_axis}" x2="{width}" y2="{y_axis}" stroke="#333"/>')
    step = _nice_step(span_ms, (width - LEFT) / 120)
    for k in range(int(span_ms / step) + 1):
        x = LEFT + k * step * px
        out.append(
            f'<line x1="{x:.2f}" y1="{y_axis}" x2="{x:.2f}" y2="{y_axis + 5}" stroke="#333"/>'
        )
        out.append(
            f'<text x="{x:.2f}" y="{y_axis + 18}" text-anchor="middle">{k * step:g} ms</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def _fmt_dur(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms" if ns >= 1e5 else f"{ns / 1e3:.1f} µs"


def page(title: str, body: str) -> str:
    """A complete HTML document with everything inline."""
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse}"
        "td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}"
        ".scroll{overflow-x:auto;border:1px solid #ccc}.sw{display:inline-block;width:12px;"
        "height:12px;margin:0 4px 0 12px;vertical-align:middle}</style>"
        f"</head><body>\n<h2>{html.escape(title)}</h2>\n{body}\n</body></html>\n"
    )


def figures_table(rows: list[tuple[str, object]]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows
    )
    return f"<table>{cells}</table>"


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def legend(kinds: list[str]) -> str:
    return (
        "<p>"
        + "".join(
            f'<span class="sw" style="background:{KINDS[k][0]}"></span>{html.escape(KINDS[k][1])}'
            for k in kinds
        )
        + "</p>"
    )


def timeline_page(tl: Timeline, summary: dict, title: str) -> str:
    """The profile's picture: key figures, legend, then the scrollable timeline."""
    keys = ("overlap_fraction", "t_rv_ee_us", "t_rv_fv_us", "reuse_rate", "ff", "omega_kappa",
            "step_ms_measured", "step_ms_predicted", "eq10_rel_error", "prefix_ms", "suffix_ms",
            "steps", "tokens_per_s")  # fmt: skip
    rows = [(k, summary.get(k)) for k in keys]
    rows += [
        (k, v)
        for k, v in summary.get("settings", {}).items()
        if k in ("gamma", "kappa", "exit_layer", "temp")
    ]
    rows += [(k, v) for k, v in summary.get("threads", {}).items()]
    if summary.get("emulated"):
        rows.insert(0, ("emulated", summary["emulated"]))
    present = sorted({kind_of(i.lane, i.name) for i in tl.intervals}, key=list(KINDS).index)
    body = (
        figures_table(rows)
        + legend(present)
        + "<p>Hover a block for its duration. Prompts run one after another on one clock.</p>"
        + f'<div class="scroll">{timeline_svg(tl)}</div>'
    )
    return page(title, body)
