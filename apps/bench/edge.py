"""`python -m apps.bench edge`: FlexSpec edge-cloud baselines over emulated links.

    python -m apps.bench edge --links 5g,4g,wifi-weak --limit 3 --max-tokens 32 --temps 0 \\
        --out-json edge.json --plot edge.html

For each link and prompt, in rotating order: cloud-only (K = 0: the target decodes on the
server, one round trip per token), fixed K ∈ {1, 3, 5, 7}, adaptive K* (eq. (11)) and
adaptive-k0 (eq. (11) with K = 0 in its range, beyond the paper: the edge may stop drafting where
drafting loses; its rounds with K = 0 are the cloud's own token). Each run
is a fresh session through a real verifier (`--server local` starts one) with the link
emulator's waits slept for real; the link seed is the same for every method on a prompt.
Reports per method: ms per token end to end, speedup over cloud-only, mean K, bytes up/down per
token (real frame lengths), acceptance. The plot (self-contained HTML, inline SVG) is latency
per token against K for each link, like FlexSpec Fig. 5.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial

from apps.bench.args import add_temps_arg, parse_temps
from apps.bench.bootstrap import ci_note
from apps.bench.edge_run import run_on_link, skip_totals
from runtime.cli_args import add_pair_args, load_pair_from_args
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError

FIXED_K = (1, 3, 5, 7)


def build_parser() -> argparse.ArgumentParser:
    from runtime.edge.cli_args import add_edge_args

    ap = doc_parser("python -m apps.bench edge", __doc__)
    add_pair_args(ap)
    add_edge_args(ap)
    ap.add_argument("--links", default="5g,4g,wifi-weak", help="comma-separated named links")
    ap.add_argument("--prompts", default=None, help="prompt set (default apps/prompts/)")
    ap.add_argument("--limit", type=int, default=3, help="first N prompts (default 3)")
    ap.add_argument("--max-tokens", type=int, default=32, help="new tokens per prompt (32)")
    add_temps_arg(ap, "0")
    ap.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="nucleus p at T > 0 on both sides (default 1: the full law; FlexSpec's "
        "Table IV, Regime B, samples with top-p 0.9 at T = 1)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-json", help="write every run and the summary here")
    ap.add_argument(
        "--plot",
        help="write latency-vs-K per link here (.html); with --codecs: "
        "K-SQS vs C-SQS ms/token and resampling rate vs temperature",
    )
    ap.add_argument(
        "--link-clock",
        choices=("sleep", "virtual"),
        default="sleep",
        help="sleep: the link's waits are slept for real (default); virtual: they are "
        "added to the measured time instead of slept (same per-round times, the "
        "edge loop being serial; about 10x faster on slow links, so many more "
        "rounds fit in a run)",
    )
    ap.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        help="bootstrap resamples of the prompts for the adaptive-vs-best-fixed-K "
        "interval (default 2000; 0: none)",
    )
    ap.add_argument(
        "--codecs",
        default=None,
        help="compare uplink codecs instead of K "
        "(ids,raw,k-sqs,c-sqs,cu-hlm; apps/bench/edge_codecs.py)",
    )
    return ap


def check_args(a: argparse.Namespace) -> tuple[list[str], list[float], dict | None, dict]:
    """(links, temperatures, the --codec's parameters, CU-HLM's skip rule per temperature); every
    bad flag fails here, before the pair loads."""
    from devices.links import LINK_NAMES

    links = a.links.split(",")
    for name in links:
        if name not in LINK_NAMES:
            raise DuetError(f"unknown link {name!r}; choose from {', '.join(LINK_NAMES)}")
    temps = parse_temps(a.temps)
    from runtime.cli_args import check_decoding_args

    for t in temps:  # --max-tokens, each temperature and --top-p, one line each
        check_decoding_args(argparse.Namespace(**{**vars(a), "temp": t, "method": "ar"}))
    from runtime.edge.cli_args import check_bit_budget

    for t in temps:  # --bit-budget: SQS §4's, for k-sqs / c-sqs only
        check_bit_budget(
            argparse.Namespace(**{**vars(a), "temp": t}),
            tuple(a.codecs.split(",")) if a.codecs else None,
        )
    params, skips = None, {}
    if not a.codecs:  # --codec (and its flags) hold for every temperature: check each, once
        from runtime.edge.cli_args import codec_params, skip_rule_from

        for t in temps:
            params = codec_params(argparse.Namespace(**{**vars(a), "temp": t}))
            skips[t] = skip_rule_from(argparse.Namespace(**{**vars(a), "temp": t}))
    elif a.skip and "cu-hlm" not in a.codecs.split(","):
        raise DuetError("--skip adds cu-hlm+skip runs beside cu-hlm: include cu-hlm in --codecs")
    elif a.skip and not any(t > 0 for t in temps):
        raise DuetError("--skip needs a temperature > 0 in --temps (CU-HLM's skip rule)")
    return links, temps, params, skips


def verifier(a: argparse.Namespace, pair):
    """(the local verifier to stop or None, host, port, token) of --server."""
    from runtime.edge.local import LocalVerifier

    if a.server == "local":
        local = LocalVerifier(pair.target_dir, target_backend=pair.settings["target_backend"])
        return local, local.host, local.port, local.token
    host, _, p = a.server.rpartition(":")
    return None, host, int(p), open(a.token_file, "rb").read().strip() if a.token_file else b""


def bench(a: argparse.Namespace) -> dict:
    from apps.bench.prompt_set import load_prompts

    links, temps, params, skips = check_args(a)
    pair = load_pair_from_args(a, need_draft=True)
    if pair.tokenizer is None:
        raise DuetError("the benchmark needs a tokenizer.json beside the target")
    recs = load_prompts(a.prompts, limit=a.limit)
    prompts = [pair.tokenizer.encode(r["turns"][0]) for r in recs]
    methods = (
        [("cloud-only", 0, 1)]
        + [(f"k{k}", k, 1) for k in FIXED_K]
        + [("adaptive", None, 1), ("adaptive-k0", None, 0)]
    )
    local, host, port, token = verifier(a, pair)
    on_link = partial(run_on_link, a, pair, (host, port, token))
    runs = []
    try:
        if a.codecs:
            from apps.bench.edge_codecs import run_codecs
            from apps.bench.edge_codecs import summarize as summarize_codecs

            runs = run_codecs(a, pair, prompts, host, port, token, links, temps)
            return {"runs": runs, "summary": summarize_codecs(runs), "settings": pair.settings}
        for temp in temps:
            for link in links:
                for i, prompt in enumerate(prompts):
                    order = methods[i % len(methods) :] + methods[: i % len(methods)]  # rotate
                    for name, k, k_min in order:
                        opts = {"k": k, "k_min": k_min, "codec": a.codec, "params": params}
                        opts["skip"] = skips.get(temp)
                        toks, wall, edge = on_link(link, i, prompt, temp, **opts)
                        acc = sum(edge["accepted"]) / max(1, sum(edge["k"]))
                        runs.append(
                            {
                                "temp": temp,
                                "top_p": a.top_p,
                                "link": link,
                                "prompt": i,
                                "method": name,
                                "codec": a.codec or ("ids" if temp == 0 else "raw"),
                                "k": k,
                                "tokens": len(toks),
                                "wall_s": wall,
                                "mean_k": edge["mean_k"],
                                "acceptance": acc,
                                "bytes_up": sum(edge["bytes_up"]),
                                "bytes_down": sum(edge["bytes_down"]),
                                "ids": toks,
                                "lossy": "skip" in edge,
                                "skip": edge.get("skip"),
                            }
                        )
                        print(
                            f"T={temp:g} {link:<9} prompt {i} {name:<11} {len(toks)} tok "
                            f"{wall / max(1, len(toks)) * 1e3:8.1f} ms/tok  mean K "
                            f"{edge['mean_k']:.2f}",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        if local is not None:
            local.stop()
    return {
        "runs": runs,
        "summary": summarize(runs),
        "settings": pair.settings,
        "adaptive_vs_fixed": adaptive_vs_fixed(runs, a.bootstrap, a.seed),
        "link_clock": a.link_clock,
    }


def summarize(runs: list[dict]) -> list[dict]:
    """Per (temp, link, method): ms/token (total wall / total tokens), speedup, K, bytes,
    acceptance."""
    out = []
    keys = sorted({(r["temp"], r["link"]) for r in runs})
    for temp, link in keys:
        rs = [r for r in runs if r["temp"] == temp and r["link"] == link]
        per = {}
        for m in dict.fromkeys(r["method"] for r in rs):
            mr = [r for r in rs if r["method"] == m]
            toks = sum(r["tokens"] for r in mr)
            per[m] = {"temp": temp, "link": link, "method": m,
                      "ms_per_token": 1e3 * sum(r["wall_s"] for r in mr) / toks,
                      "mean_k": sum(r["mean_k"] for r in mr) / len(mr),
                      "bytes_up_per_token": sum(r["bytes_up"] for r in mr) / toks,
                      "bytes_down_per_token": sum(r["bytes_down"] for r in mr) / toks,
                      "acceptance": sum(r["acceptance"] for r in mr) / len(mr),
                      "lossy": any(r.get("lossy") for r in mr)}  # fmt: skip
            if per[m]["lossy"]:  # --skip: skip rate and measured R over these runs
                per[m].update(skip_totals([r["skip"] for r in mr]))
        base = per.get("cloud-only", {}).get("ms_per_token")
        for v in per.values():
            v["speedup"] = base / v["ms_per_token"] if base else None
            out.append(v)
    return out


def adaptive_vs_fixed(runs: list[dict], resamples: int = 2000, seed: int = 0) -> list[dict]:
    """Per (temp, link): adaptive's ms/token over the best fixed K's (the issue's 5 % goal),
    and adaptive-k0's (eq. (11) over K ≥ 0) over the best fixed K ≥ 0 (cloud-only included),
    with a 95 % percentile bootstrap interval over prompts (paired: a resample keeps every
    method's run on each drawn prompt). The best fixed K is the one best on all prompts."""
    import numpy as np

    from apps.bench.bootstrap import prompt_ci

    rng = np.random.default_rng(seed)
    out = []
    cells = sorted({(r["temp"], r["link"]) for r in runs})
    for (temp, link), adaptive in ((c, m) for c in cells for m in ("adaptive", "adaptive-k0")):
        rs = [r for r in runs if r["temp"] == temp and r["link"] == link]
        fixed = sorted({r["method"] for r in rs if r["method"].startswith("k")})
        if adaptive == "adaptive-k0" and "cloud-only" in {r["method"] for r in rs}:
            fixed.append("cloud-only")  # K = 0 is in its range: the best fixed K may be 0
        if adaptive not in {r["method"] for r in rs} or not fixed:
            continue
        prompts = sorted({r["prompt"] for r in rs})
        idx = {p: j for j, p in enumerate(prompts)}
        names = [adaptive, *fixed]
        wall = np.zeros((len(names), len(prompts)))
        toks = np.zeros_like(wall)
        for r in rs:
            if r["method"] in names:
                wall[names.index(r["method"]), idx[r["prompt"]]] += r["wall_s"]
                toks[names.index(r["method"]), idx[r["prompt"]]] += r["tokens"]
        ms = wall.sum(1) / np.maximum(1, toks.sum(1))
        best = 1 + int(np.argmin(ms[1:]))
        ratio = float(ms[0] / ms[best])
        row = {"temp": temp, "link": link, "method": adaptive, "best_fixed": names[best],
               "ratio": ratio,
               "prompts": len(prompts), "tokens": int(toks[0].sum())}  # fmt: skip
        if resamples and len(prompts) > 1:

            def ratio(p, best=best, wall=wall, toks=toks):
                w, t = wall[:, p].sum(1), np.maximum(1, toks[:, p].sum(1))
                return (w[0] / t[0]) / (w[best] / t[best])

            row["ci95"] = prompt_ci(ratio, len(prompts), resamples, rng)
        out.append(row)
    return out


def plot_html(summary: list[dict], path: str) -> None:
    """Latency per token vs K (cloud-only at K = 0, adaptive as a dashed level) per link, SVG."""
    W, H, P = 640, 360, 50
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    series = sorted({(s["temp"], s["link"]) for s in summary})
    ymax = max(s["ms_per_token"] for s in summary) * 1.1
    x = lambda k: P + k / 7 * (W - 2 * P)  # noqa: E731
    y = lambda v: H - P - v / ymax * (H - 2 * P)  # noqa: E731
    parts = [f'<line x1="{P}" y1="{H - P}" x2="{W - P}" y2="{H - P}" stroke="black"/>',
             f'<line x1="{P}" y1="{P}" x2="{P}" y2="{H - P}" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">K (0 = cloud-only)</text>',
             f'<text x="12" y="{P - 15}">ms per token (max {ymax:.0f})</text>']  # fmt: skip
    for k in range(8):
        parts.append(f'<text x="{x(k)}" y="{H - P + 16}" text-anchor="middle">{k}</text>')
    for j, (temp, link) in enumerate(series):
        c = colors[j % len(colors)]
        pts = {
            0 if s["method"] == "cloud-only" else int(s["method"][1:]): s["ms_per_token"]
            for s in summary
            if (s["temp"], s["link"]) == (temp, link) and not s["method"].startswith("adaptive")
        }
        line = " ".join(f"{x(k):.1f},{y(v):.1f}" for k, v in sorted(pts.items()))
        parts.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="2"/>')
        ad = [s for s in summary if (s["temp"], s["link"], s["method"]) == (temp, link, "adaptive")]
        if ad:
            v = y(ad[0]["ms_per_token"])
            parts.append(
                f'<line x1="{P}" y1="{v:.1f}" x2="{W - P}" y2="{v:.1f}" stroke="{c}" '
                'stroke-dasharray="5,4"/>'
            )
        parts.append(f'<text x="{W - P + 4}" y="{P + 16 * j}" fill="{c}">{link} T={temp:g}</text>')
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W + 90}" height="{H}">'
        f"{''.join(parts)}</svg>"
    )
    html = (
        "<!doctype html><meta charset=utf-8><title>FlexSpec latency vs K</title>"
        "<h3>Latency per token vs K per link (dashed: adaptive K*)</h3>" + svg
    )
    with open(path, "w") as f:
        f.write(html)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.codecs:
        from runtime.edge.codecs import codec

        for name in a.codecs.split(","):
            codec(name)
    res = bench(a)
    if a.out_json:
        with open(a.out_json, "w") as f:
            json.dump(res, f, indent=1)
    if a.codecs:
        from apps.bench.edge_codecs import plot_crossover, print_table

        if a.plot:
            plot_crossover(res["summary"], a.plot)
        print_table(res["summary"])
    else:
        if a.plot:
            plot_html(res["summary"], a.plot)
        print_summary(res)
    if a.link_clock == "virtual":
        print(
            "link waits on a virtual clock (--link-clock virtual): compute measured, link "
            "time emulated and added, not slept"
        )
    return 0


def print_summary(res: dict) -> None:
    """The per-link table of `bench`, then adaptive K against the best fixed K."""
    print(
        f"{'T':>3} {'link':<9} {'method':<11} {'ms/tok':>8} {'speedup':>8} {'mean K':>7} "
        f"{'up B/tok':>9} {'down B/tok':>10} {'accept':>7}"
    )
    for s in res["summary"]:
        print(
            f"{s['temp']:>3g} {s['link']:<9} {s['method']:<11} {s['ms_per_token']:>8.1f} "
            f"{s['speedup']:>8.2f} {s['mean_k']:>7.2f} {s['bytes_up_per_token']:>9.1f} "
            f"{s['bytes_down_per_token']:>10.1f} {s['acceptance']:>7.2f}"
            + (
                f"  LOSSY skip {s['skip_rate']:.2f} R {s.get('measured_risk', float('nan')):.4f}"
                if s["lossy"]
                else ""
            )
        )
    for r in res["adaptive_vs_fixed"]:
        print(
            f"T={r['temp']:g} {r['link']}: {r['method']} / best fixed ({r['best_fixed']}) "
            f"= {r['ratio']:.3f}"
            + ci_note(r.get("ci95"))
            + f" over {r['prompts']} prompts, {r['tokens']} tokens"
        )
