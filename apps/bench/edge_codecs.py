"""`python -m apps.bench edge --codecs ids,raw,k-sqs,c-sqs,cu-hlm`: the uplink codecs of
issue 13 through a real verifier over emulated links.

    python -m apps.bench edge --codecs ids,raw,k-sqs,c-sqs,cu-hlm --links 5g,4g,wifi-weak \\
        --temps 0.2,0.5,0.8,1.0 --limit 2 --max-tokens 32 --out-json codecs.json --plot x.html

Every run is adaptive K* (eq. (11), which sees each codec's real frame bytes; --bit-budget below
replaces it) in a fresh session; codecs rotate per prompt; the link seed is the same for every
codec on a prompt. `ids` carries no q, so it runs only at T = 0. Per (T, link, codec): uplink
bits per drafted token (real frame bytes, and the eq. (1) model + payload header, which must
match up to the 21-byte frame and
VERIFY header and byte padding), acceptance (accepted / drafted), resampling rate (rounds with a
rejection / rounds), ms per token end to end. Codec parameters: each codec's DEFAULTS
(runtime/edge/codecs/) unless the codec flags of `--method flexspec` say otherwise.
`--skip` adds `cu-hlm+skip` runs at T > 0: cu-hlm with CU-HLM's LOSSY skipping, marked lossy,
with the skip rate and the rejection risk R measured against the target (runtime/edge/skip.py).
Each summary row keeps the mean per-round time split (draft, uplink, cloud, downlink ms).
The plot: ms per token and resampling rate vs temperature for K-SQS and C-SQS per link (SQS
Fig. 2's two panels).
`--bit-budget B` (SQS §4's setup, k-sqs and c-sqs only): each round drafts until the next row
would push its body over B bits, capped by --k else --k-max, instead of adaptive K*.
"""

from __future__ import annotations

import sys
from functools import partial

from runtime.errors import DuetError

VERIFY_HEAD = 16 + 5  # frame header + u8 codec, u32 base
# per-round time split kept per run
EDGE_KEYS = ("total_draft_s", "total_uplink_s", "total_cloud_s", "total_downlink_s", "rounds",
             "sent_rounds", "bytes_up", "rate_bps")  # fmt: skip


SKIP = "cu-hlm+skip"  # --skip: cu-hlm with CU-HLM's LOSSY skipping (runtime/edge/skip.py)


def run_codecs(a, pair, prompts, host, port, token, links, temps) -> list[dict]:
    """Every (T, link, prompt, codec) run as a record."""
    from apps.bench.edge_run import run_on_link
    from runtime.edge.cli_args import CODEC_FLAGS
    from runtime.edge.skip import skip_rule

    codecs = a.codecs.split(",") + ([SKIP] if a.skip else [])
    budget = getattr(a, "bit_budget", None)  # checked by apps.bench.edge.bench
    on_link = partial(run_on_link, a, pair, (host, port, token))
    runs = []
    for temp in temps:
        todo = [c for c in codecs if temp > 0 or c in ("ids", "raw")]
        todo = [c for c in todo if not (temp > 0 and c == "ids")]
        rule = skip_rule(temp, a.u_th) if a.skip and temp > 0 else None
        for link in links:
            for i, prompt in enumerate(prompts):
                for name in todo[i % len(todo) :] + todo[: i % len(todo)]:
                    params = {
                        key: getattr(a, flag)
                        for flag, key in CODEC_FLAGS.get(name.removesuffix("+skip"), {}).items()
                        if getattr(a, flag) is not None
                    }

                    opts = {"k": a.k, "k_max": a.k_max, "bit_budget": budget}
                    opts |= {"codec": name.removesuffix("+skip"), "params": params or None}
                    opts["skip"] = rule if name == SKIP else None
                    toks, wall, e = on_link(link, i, prompt, temp, **opts)
                    drafted = sum(e["k"]) or 1
                    heads = VERIFY_HEAD * e["sent_rounds"]
                    mb = [b for b in e["model_bits"] if b is not None]
                    runs.append(
                        {
                            "temp": temp,
                            "link": link,
                            "prompt": i,
                            "codec": name,
                            "tokens": len(toks),
                            "wall_s": wall,
                            "drafted": sum(e["k"]),
                            "accepted": sum(e["accepted"]),
                            "rounds": e["rounds"],
                            "rejected_rounds": sum(
                                1 for k, x in zip(e["k"], e["accepted"], strict=True) if x < k
                            ),
                            "bytes_up": sum(e["bytes_up"]),
                            "payload_bytes": sum(e["bytes_up"]) - heads,
                            "model_bits": sum(mb) if mb else None,
                            "mean_k": e["mean_k"],
                            "max_body_bits": max(e["body_bits"]) if e.get("body_bits") else None,
                            "codec_stats": e.get("codec_stats"),
                            "lossy": "skip" in e,
                            "skip": e.get("skip"),
                            "edge": {key: e[key] for key in EDGE_KEYS},
                        }
                    )
                    print(
                        f"T={temp:g} {link:<9} prompt {i} {name:<7} {len(toks)} tok "
                        f"{wall / max(1, len(toks)) * 1e3:8.1f} ms/tok  mean K {e['mean_k']:.2f}  "
                        f"{8 * sum(e['bytes_up']) / drafted:9.0f} up bits/draft",
                        file=sys.stderr,
                        flush=True,
                    )
    return runs


def summarize(runs: list[dict]) -> list[dict]:
    """Per (T, link, codec): bits, acceptance, resampling rate, ms/token; raw-relative columns."""
    out = []
    for key in dict.fromkeys((r["temp"], r["link"], r["codec"]) for r in runs):
        rs = [r for r in runs if (r["temp"], r["link"], r["codec"]) == key]
        d = sum(r["drafted"] for r in rs) or 1
        mb = [r["model_bits"] for r in rs]
        out.append(
            {
                "temp": key[0],
                "link": key[1],
                "codec": key[2],
                "up_bits_per_draft": 8 * sum(r["bytes_up"] for r in rs) / d,
                "up_bits_per_token": 8
                * sum(r["bytes_up"] for r in rs)
                / max(1, sum(r["tokens"] for r in rs)),
                "payload_bits_per_draft": 8 * sum(r["payload_bytes"] for r in rs) / d,
                "model_bits_per_draft": sum(mb) / d if None not in mb else None,
                "acceptance": sum(r["accepted"] for r in rs) / d,
                "resample_rate": sum(r["rejected_rounds"] for r in rs)
                / max(1, sum(r["rounds"] for r in rs)),
                "ms_per_token": 1e3
                * sum(r["wall_s"] for r in rs)
                / max(1, sum(r["tokens"] for r in rs)),
                "mean_k": sum(r["mean_k"] for r in rs) / len(rs),
                "theorem2_met": [
                    r["codec_stats"]["theorem2_met"] for r in rs if r.get("codec_stats")
                ],
                "lossy": any(r["lossy"] for r in rs),
                "split_ms_per_round": split_per_round(rs),
            }
        )
        if out[-1]["lossy"]:
            from apps.bench.edge_run import skip_totals

            out[-1].update(skip_totals([r["skip"] for r in rs]))
    for s in out:
        raw = [
            x for x in out if (x["temp"], x["link"], x["codec"]) == (s["temp"], s["link"], "raw")
        ]
        s["bits_vs_raw"] = (
            s["payload_bits_per_draft"] / raw[0]["payload_bits_per_draft"] if raw else None
        )
        s["acceptance_vs_raw"] = s["acceptance"] - raw[0]["acceptance"] if raw else None
        s["speedup_vs_raw"] = raw[0]["ms_per_token"] / s["ms_per_token"] if raw else None
    return out


def split_per_round(rs: list[dict]) -> dict:
    """Mean ms per sent round spent drafting, on the uplink, in the cloud and on the downlink."""
    n = sum(r["edge"]["sent_rounds"] for r in rs) or 1
    return {
        k: 1e3 * sum(r["edge"][f"total_{k}_s"] for r in rs) / n
        for k in ("draft", "uplink", "cloud", "downlink")
    }


def plot_crossover(summary: list[dict], path: str, note: str = "") -> None:
    """SQS Fig. 2's two panels vs temperature, ms per token and resampling rate: K-SQS solid,
    C-SQS dashed, one colour per link (SVG in HTML); `note` is added to the heading."""
    rows = [s for s in summary if s["codec"] in ("k-sqs", "c-sqs") and s["temp"] > 0]
    if not rows:
        raise DuetError("--plot needs k-sqs or c-sqs runs at T > 0")
    panels = [_panel(rows, "ms_per_token", "ms per token"),
              _panel(rows, "resample_rate",
                     "resampling rate (rounds with a rejection)")]  # fmt: skip
    with open(path, "w") as f:
        f.write(
            "<!doctype html><meta charset=utf-8><title>K-SQS vs C-SQS latency</title>"
            f"<h3>{note}vs temperature: K-SQS solid, C-SQS dashed</h3>" + "<br>".join(panels)
        )


def _panel(rows: list[dict], key: str, label: str) -> str:
    """One SVG: `key` of each (link, codec) vs temperature."""
    W, H, P = 640, 360, 56
    temps = sorted({s["temp"] for s in rows})
    ymax = max(s[key] for s in rows) * 1.1 or 1.0
    lo, hi = min(temps), max(temps) if max(temps) > min(temps) else min(temps) + 1
    x = lambda t: P + (t - lo) / (hi - lo) * (W - 2 * P)  # noqa: E731
    y = lambda v: H - P - v / ymax * (H - 2 * P)  # noqa: E731
    parts = [f'<line x1="{P}" y1="{H - P}" x2="{W - P}" y2="{H - P}" stroke="black"/>',
             f'<line x1="{P}" y1="{P}" x2="{P}" y2="{H - P}" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">temperature</text>',
             f'<text x="8" y="{P - 18}">{label} (max {ymax:.3g})</text>']  # fmt: skip
    parts += [
        f'<text x="{x(t):.1f}" y="{H - P + 16}" text-anchor="middle">{t:g}</text>' for t in temps
    ]
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    links = list(dict.fromkeys(s["link"] for s in rows))
    for j, link in enumerate(links):
        for codec, dash in (("k-sqs", ""), ("c-sqs", ' stroke-dasharray="6,4"')):
            pts = sorted(
                (s["temp"], s[key]) for s in rows if (s["link"], s["codec"]) == (link, codec)
            )
            line = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
            parts.append(
                f'<polyline points="{line}" fill="none" stroke="{colors[j % 4]}" '
                f'stroke-width="2"{dash}/>'
            )
        parts.append(f'<text x="{W - P + 4}" y="{P + 16 * j}" fill="{colors[j % 4]}">{link}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + 90}" height="{H}">'
        f"{''.join(parts)}</svg>"
    )


def print_table(summary: list[dict]) -> None:
    print(
        f"{'T':>4} {'link':<9} {'codec':<7} {'up b/draft':>10} {'payload b':>10} {'model b':>9} "
        f"{'vs raw':>7} {'accept':>7} {'Δacc':>6} {'resample':>8} {'ms/tok':>8} {'×raw':>5} "
        f"{'up b/tok':>8} {'mean K':>6}"
    )
    f = lambda v, fmt: format(v, fmt) if v is not None else "-"  # noqa: E731
    for s in summary:
        print(
            f"{s['temp']:>4g} {s['link']:<9} {s['codec']:<7} {s['up_bits_per_draft']:>10.0f} "
            f"{s['payload_bits_per_draft']:>10.0f} {f(s['model_bits_per_draft'], '9.0f'):>9} "
            f"{f(s['bits_vs_raw'], '7.3f'):>7} {s['acceptance']:>7.3f} "
            f"{f(s['acceptance_vs_raw'], '+6.3f'):>6} {s['resample_rate']:>8.2f} "
            f"{s['ms_per_token']:>8.1f} {f(s['speedup_vs_raw'], '5.2f'):>5} "
            f"{s['up_bits_per_token']:>8.0f} {s['mean_k']:>6.2f}"
            + (
                f"  LOSSY skip {s['skip_rate']:.2f} R {s.get('measured_risk', float('nan')):.4f}"
                f" (Thm 1 bound {s['theorem1_bound']:.3f})"
                if s["lossy"]
                else ""
            )
        )
