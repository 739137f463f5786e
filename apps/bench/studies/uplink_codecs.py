"""`python -m apps.bench.studies.uplink_codecs`: what the compressed uplinks cost and keep, on a
real pair.

    python -m apps.bench.studies.uplink_codecs --limit 8 --temps 0.2,0.5,0.8,1.0 --json

Over teacher-forced contexts (each held-out prompt followed by its reference
text, one forward pass of target and draft), at each temperature it reports per
codec (k-sqs, c-sqs, cu-hlm):
  - bits per drafted token on the wire: the real payload bytes (header included,
    batches of --gamma rows) and the codec's bit model; against raw float32 and
    float16 (V values per token);
  - expected acceptance per token, E[sum_x min(p, q^)] with q^ the *decoded*
    distribution the draft sampled from, against raw's E[sum_x min(p, q)] (and their ratio);
  - the batch length L^t that SQS §4's per-batch budget B (--budget bits of eq. 1)
    allows, averaged over consecutive batches of these rows;
  - C-SQS: the Theorem 2 check (mean dropped mass over kept tokens vs eq. 9), with
    verdicts from rejection sampling on these contexts;
  - CU-HLM: the eq. (7) fit of beta_d on u (a, b, r), Delta, u_th (eq. 12), the skip
    rate at u_th and the measured rejection risk E[beta_d 1(u <= u_th)] (skipping is
    lossy and is not applied to the codec rows), and the mean online k(t)* (eq. 24).
    CU-HLM's rows use the online k(t)* unless --cu-k fixes k (the wire codec's way), with
    --cu-levels log (default) or linear 8-bit probabilities;
  - cu-hlm-offline: CU-HLM with the offline k* of eq. (21), min{k : E_t[U_TV(k, t)] <= theta},
    the expectation taken over the first half of the positions (the server's history that
    the paper's downlink feedback supplies) and the rows coded over the second half only.
  - `--links`: MODELED ms per token of k-sqs and c-sqs on each named link (devices.links), from
    the measured acceptance alpha and wire bits: a round of --gamma drafted tokens takes the
    link's RTT plus gamma * bits / rate (FlexSpec eq. 8; edge and cloud compute left out:
    the links' RTTs, 0.42-1.2 s, dwarf them) and commits (1 - alpha^(gamma+1)) / (1 - alpha)
    tokens (FlexSpec §IV-B's geometric model, i.i.d. acceptance); the resampling rate is
    1 - alpha^gamma. Teacher forcing gives alpha without sampling noise, which the end-to-end
    bench (apps.bench edge --codecs) cannot resolve below a few per cent. `--plot` draws it
    as SQS Fig. 2's two panels.
The eq. (7) fit is in-sample (fitted and evaluated on the same positions).
Teacher forcing continues the reference text after a rejection, where a real
run would continue from the correction: the contexts are real text, the
batches' verdicts are not a real session's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from apps.bench.args import add_temps_arg, parse_temps
from kernels import cuhlm, payload_cuhlm, sqs
from kernels.payloads import decode, make_codec
from kernels.sampling import probs_from_logits, sample
from kernels.verify import verify_sampling
from runtime.cli_args import add_pair_args, load_pair_from_args
from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main


def contexts(pair, prompts_path: str | None, limit: int, max_len: int):
    """Target and draft logits (n, V) over held-out prompts + references, teacher-forced."""
    from apps.bench.prompt_set import load_prompts

    lt, ld = [], []
    for item in load_prompts(prompts_path)[:limit]:
        text = item["turns"][0] + (item.get("reference") or [""])[0]
        ids = pair.tokenizer.encode(text)[:max_len]
        if len(ids) < 2:
            continue
        x = np.array([ids])
        lt.append(np.asarray(pair.target.forward(x, pair.target.new_cache()))[0, :-1])
        ld.append(np.asarray(pair.draft.forward(x, pair.draft.new_cache()))[0, :-1])
    if not lt:
        raise DuetError("no usable prompts: each needs at least two tokens")
    return np.concatenate(lt).astype(np.float32), np.concatenate(ld).astype(np.float32)


def mean_batch_length(row_bits: list[int], budget: int) -> float:
    """Mean L^t (SQS §4) over consecutive batches, each starting where the last one stopped."""
    lengths, s = [], 0
    while s < len(row_bits):
        n = sqs.batch_length(row_bits[s:], budget)
        lengths.append(n)
        s += max(n, 1)  # a row over budget alone is skipped past
    return float(np.mean(lengths))


def eq1_bits(name, rows, v, ell) -> list[int]:
    """Eq. (1) per row (K-SQS / C-SQS), or CU-HLM's row bits."""
    if name == "k-sqs":
        return [sqs.ksqs_bits(v, len(r.ids), ell) for r in rows]
    if name == "c-sqs":
        return [sqs.csqs_bits(v, len(r.ids), ell) for r in rows]
    return [payload_cuhlm.row_bits(v, len(r.ids)) for r in rows]


def run_codec(name, params, p, q, gamma, rng, budget=5000):
    """Encode every position in batches of gamma rows; decode; account bits and acceptance."""
    v = q.shape[1]
    codec = make_codec(name, **params)
    wire = model = 0
    accept, bits = [], []
    for s in range(0, len(q), gamma):
        rows = codec.quantize(q[s : s + gamma])
        q_hat = codec.qhat(rows, v)
        toks = sample(q_hat, rng.random(len(rows)))  # the draft samples from q^
        data = codec.encode(rows, toks, v)
        got, q_dec = decode(data, v)
        assert (got == toks).all() and (q_dec == q_hat).all(), f"{name}: round trip failed"
        wire += 8 * len(data)
        model += 8 * codec.header_bytes() + codec.body_bits(rows, v)
        accept += np.minimum(p[s : s + gamma], q_dec).sum(-1).tolist()
        bits += eq1_bits(name, rows, v, params.get("ell", 0))
        if name == "c-sqs":  # Alg. 1 lines 11-13 with the verdict of rejection sampling
            pw = np.concatenate([p[s : s + len(rows)], p[s + len(rows) - 1 : s + len(rows)]])
            a, _ = verify_sampling(pw, q_dec, toks, rng.random(len(rows)), rng.random())
            codec.threshold.verdict(a)
    out = {"bits_per_token": wire / len(q), "model_bits_per_token": model / len(q),
           "acceptance": float(np.mean(accept)),
           "mean_batch_length": mean_batch_length(bits, budget)}  # fmt: skip
    if name == "c-sqs":
        t = codec.threshold
        out["theorem2"] = {"mean_dropped": t.dropped_sum / t.kept, "kept": t.kept,
                           "bound": sqs.theorem2_bound(t.alpha, t.eta, t.beta1,
                                                       t.kept)}  # fmt: skip
        out["theorem2"]["met"] = out["theorem2"]["mean_dropped"] <= out["theorem2"]["bound"]
    return out


def cuhlm_stats(lt, ld, temp, m, theta_max, theta, rng):
    """Eq. (7) fit, u_th, skip rate, measured rejection risk and online k(t)* over the positions."""
    x_all = probs_from_logits(ld, temp)
    y_all = probs_from_logits(lt, temp)
    us, betas, ks, below = [], [], [], []
    for z, x, y in zip(ld, x_all, y_all, strict=True):
        d = int(sample(x, rng.random()))
        th = cuhlm.perturbation_temperatures(rng, m, theta_max)
        us.append(cuhlm.uncertainty(z, d, th, rng.random(m)))  # eq. (8)-(9)
        betas.append(cuhlm.rejection_probability(float(x[d]), float(y[d])))
        below.append(float(y[d]) < float(x[d]))
    us, betas = np.array(us), np.array(betas)
    try:
        fit = cuhlm.fit_linear(us, betas)
    except ValueError as e:
        return {"fit": None, "why": str(e)}
    delta = float(np.mean(below))
    u_th = cuhlm.uncertainty_threshold(fit.a, fit.b, delta)
    skipped = us <= u_th  # eq. (10)
    for x, u in zip(x_all, us, strict=True):
        ks.append(cuhlm.k_online(x, float(x.max()), float(u), fit.a, fit.b, theta))
    return {
        "a": fit.a,
        "b": fit.b,
        "r": fit.r,
        "mse": fit.mse,
        "delta": delta,
        "u_th": u_th,
        "skip_rate": float(skipped.mean()),
        "measured_risk": float(np.mean(np.where(skipped, betas, 0.0))),
        "model_risk": cuhlm.rejection_risk(us, fit.a, fit.b, u_th),
        "mean_k_online": float(np.mean(ks)),
        "ks": ks,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.bench.studies.uplink_codecs", __doc__)
    add_pair_args(ap)
    ap.add_argument("--prompts", default=None, help="prompt set (default apps/prompts/)")
    ap.add_argument("--limit", type=int, default=8, help="prompts to use (default 8)")
    ap.add_argument("--max-len", type=int, default=256, help="tokens per context (default 256)")
    add_temps_arg(ap, "0.2,0.5,0.8,1.0")
    ap.add_argument("--gamma", type=int, default=4, help="rows per payload (default 4)")
    ap.add_argument("--budget", type=int, default=5000, help="SQS §4 bits per batch B (5000)")
    ap.add_argument("--k", type=int, default=8, help="K-SQS's K (default 8)")
    ap.add_argument("--ell", type=int, default=100, help="lattice resolution (default 100, SQS §4)")
    ap.add_argument("--alpha", type=float, default=5e-4, help="C-SQS alpha (default 5e-4, SQS §4)")
    ap.add_argument("--eta", type=float, default=1e-3, help="C-SQS eta (default 1e-3, SQS §4)")
    ap.add_argument("--beta", type=float, default=0.01, help="C-SQS initial beta (default 0.01)")
    ap.add_argument("--theta", type=float, default=0.1, help="CU-HLM TVD tolerance (default 0.1)")
    ap.add_argument(
        "--cu-k",
        type=int,
        default=None,
        help="CU-HLM with this fixed k (the wire codec's) instead of the online k(t)*",
    )
    ap.add_argument(
        "--cu-levels",
        default="log",
        choices=("log", "linear"),
        help="CU-HLM's 8-bit probabilities: log 2^(-16 v/255) (default) or linear v/255",
    )
    ap.add_argument("--m", type=int, default=16, help="CU-HLM perturbation samples M (default 16)")
    ap.add_argument("--theta-max", type=float, default=1.0, help="CU-HLM theta_max (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--links",
        default="5g,4g,wifi-weak",
        help="named links for the MODELED ms per token of k-sqs and c-sqs ('' for none)",
    )
    ap.add_argument(
        "--plot",
        default=None,
        help="write the modeled ms per token and resampling rate vs T here (.html)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def modeled_latency(row: dict, link, gamma: int) -> dict:
    """MODELED ms per token and resampling rate of one codec row on `link` (module docstring)."""
    from devices.latency import expected_accepted

    alpha = row["acceptance"]
    round_s = link.rtt_s + gamma * row["bits_per_token"] / link.rate_bps  # FlexSpec eq. (8)
    tokens = expected_accepted(gamma, alpha, "geometric")  # FlexSpec §IV-B geometric decay
    return {"ms_per_token": 1e3 * round_s / tokens, "resample_rate": 1.0 - alpha**gamma}


@cli_main
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    temps = parse_temps(args.temps)
    if any(t <= 0 for t in temps) or args.gamma < 1 or args.k < 1 or args.ell < 1:
        raise DuetError("--temps must be > 0, and --gamma, --k, --ell >= 1")
    if args.cu_k is not None and args.cu_k < 1:
        raise DuetError(f"--cu-k must be at least 1 (got {args.cu_k})")
    from devices.links import LINKS

    links = [x.strip() for x in args.links.split(",") if x.strip()]
    if bad := [x for x in links if x not in LINKS]:
        raise DuetError(f"--links: unknown link {bad[0]!r}; choose from {', '.join(LINKS)}")
    if args.plot and not links:
        raise DuetError("--plot draws the modeled latency per link: give --links")
    pair = load_pair_from_args(args, need_draft=True)
    if pair.tokenizer is None:
        raise DuetError("this benchmark needs a tokenizer.json beside the target")
    t0 = time.perf_counter()
    lt, ld = contexts(pair, args.prompts, args.limit, args.max_len)
    v = lt.shape[1]
    report = {"positions": len(lt), "vocab": v, "raw_float32_bits": 32 * v,
              "raw_float16_bits": 16 * v, "temps": {}}  # fmt: skip
    rng = np.random.default_rng(args.seed)
    for temp in temps:
        p, q = probs_from_logits(lt, temp), probs_from_logits(ld, temp)
        cu = cuhlm_stats(lt, ld, temp, args.m, args.theta_max, args.theta, rng)
        params = {"k-sqs": dict(k=args.k, ell=args.ell),
                  "c-sqs": dict(ell=args.ell, alpha=args.alpha, eta=args.eta, beta=args.beta),
                  "cu-hlm": dict(k=args.cu_k or args.k, levels=args.cu_levels)}  # fmt: skip
        row = {"raw_acceptance": float(np.minimum(p, q).sum(-1).mean())}
        for name, prm in params.items():
            if name == "cu-hlm" and args.cu_k is None and cu.get("ks"):
                row[name] = run_cuhlm_online(
                    p, q, cu["ks"], args.gamma, rng, args.budget, args.cu_levels
                )
            else:
                row[name] = run_codec(name, prm, p, q, args.gamma, rng, args.budget)
            row[name]["acceptance_vs_raw"] = row[name]["acceptance"] / row["raw_acceptance"]
        row["cu-hlm-offline"] = run_cuhlm_offline(
            p, q, args.theta, args.gamma, rng, args.budget, args.cu_levels
        )
        cu.pop("ks", None)
        row["cu-hlm-fit"] = cu
        for name in ("k-sqs", "c-sqs"):
            row[name]["modeled"] = {
                x: modeled_latency(row[name], LINKS[x], args.gamma) for x in links
            }
        report["temps"][str(temp)] = row
    report["wall_s"] = time.perf_counter() - t0
    if args.plot:
        from apps.bench.edge_codecs import plot_crossover

        plot_crossover(
            [
                {"temp": float(t), "link": x, "codec": c, **row[c]["modeled"][x]}
                for t, row in report["temps"].items()
                for c in ("k-sqs", "c-sqs")
                for x in links
            ],
            args.plot,
            "MODELED from measured acceptance and wire bits (apps.bench.studies.uplink_codecs), ",
        )
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    return 0


def run_cuhlm_online(p, q, ks, gamma, rng, budget=5000, levels="log"):
    """CU-HLM rows with the online k(t)* of eq. (24) per position."""
    v = q.shape[1]
    codec = make_codec("cu-hlm", levels=levels)
    wire = model = 0
    accept, bits = [], []
    for s in range(0, len(q), gamma):
        rows = codec.quantize(q[s : s + gamma], ks=ks[s : s + gamma])
        q_hat = codec.qhat(rows, v)
        toks = sample(q_hat, rng.random(len(rows)))  # a fresh draw from x^ (kernels/cuhlm.py)
        data = codec.encode(rows, toks, v)
        got, q_dec = decode(data, v)
        assert (got == toks).all() and (q_dec == q_hat).all(), "cu-hlm: round trip failed"
        wire += 8 * len(data)
        model += 8 * codec.header_bytes() + codec.body_bits(rows, v)
        accept += np.minimum(p[s : s + gamma], q_dec).sum(-1).tolist()
        bits += eq1_bits("cu-hlm", rows, v, 0)
    return {
        "bits_per_token": wire / len(q),
        "model_bits_per_token": model / len(q),
        "acceptance": float(np.mean(accept)),
        "mean_batch_length": mean_batch_length(bits, budget),
    }


def run_cuhlm_offline(p, q, theta, gamma, rng, budget=5000, levels="log"):
    """CU-HLM with the offline k* (eq. 21): E_t[U_TV] over the first half, rows over the second."""
    half = len(q) // 2
    if half < 1:
        raise DuetError("cu-hlm-offline needs two positions: a calibration half and a test half")
    # eq. (21): x = the draft's q, y = the target's p
    k_star = cuhlm.k_offline(q[:half], p[:half], theta)
    prm = {"k": k_star, "levels": levels}
    out = run_codec("cu-hlm", prm, p[half:], q[half:], gamma, rng, budget)
    out["acceptance_raw_same_rows"] = float(np.minimum(p[half:], q[half:]).sum(-1).mean())
    out["acceptance_vs_raw"] = out["acceptance"] / out["acceptance_raw_same_rows"]
    out["k_star"] = k_star
    return out


def print_table(r) -> None:
    print(
        f"{r['positions']} positions, V = {r['vocab']}: raw float32 {r['raw_float32_bits']} "
        f"bits/token, float16 {r['raw_float16_bits']}"
    )
    print(
        f"{'temp':>5} {'codec':>7} {'bits/tok':>9} {'model':>9} {'%f32':>6} {'%f16':>6} "
        f"{'accept':>7} {'raw acc':>7} {'acc/raw':>7} {'L^t':>6}"
    )
    for temp, row in r["temps"].items():
        for name in ("k-sqs", "c-sqs", "cu-hlm", "cu-hlm-offline"):
            c = row[name]
            raw_acc = c.get("acceptance_raw_same_rows", row["raw_acceptance"])
            label = "cu-off" if name == "cu-hlm-offline" else name
            print(
                f"{temp:>5} {label:>7} {c['bits_per_token']:9.1f} {c['model_bits_per_token']:9.1f} "
                f"{100 * c['bits_per_token'] / r['raw_float32_bits']:6.2f} "
                f"{100 * c['bits_per_token'] / r['raw_float16_bits']:6.2f} "
                f"{c['acceptance']:7.3f} {raw_acc:7.3f} "
                f"{c['acceptance_vs_raw']:7.3f} {c['mean_batch_length']:6.1f}"
            )
        t2 = row["c-sqs"]["theorem2"]
        f = row["cu-hlm-fit"]
        print(
            f"      C-SQS Thm 2: mean dropped {t2['mean_dropped']:.2e} <= {t2['bound']:.2e}: "
            f"{t2['met']}"
        )
        if f.get("a") is not None:
            print(
                f"      CU-HLM: a={f['a']:.3f} b={f['b']:.3f} r={f['r']:.3f} "
                f"Delta={f['delta']:.3f} "
                f"u_th={f['u_th']:.3f} skip={f['skip_rate']:.3f} risk={f['measured_risk']:.2e} "
                f"mean k={f['mean_k_online']:.1f} offline k*={row['cu-hlm-offline']['k_star']}"
            )
    modeled = [(t, x) for t, row in r["temps"].items() for x in row["k-sqs"].get("modeled", {})]
    if modeled:
        print(
            "MODELED ms/token (RTT + gamma*bits/rate per round, geometric tokens per round; "
            "measured acceptance and bits), k-sqs | c-sqs, and the lower:"
        )
        for t, x in modeled:
            k, c = (r["temps"][t][n]["modeled"][x] for n in ("k-sqs", "c-sqs"))
            low = "k-sqs" if k["ms_per_token"] < c["ms_per_token"] else "c-sqs"
            print(
                f"{t:>5} {x:<9} {k['ms_per_token']:8.1f} | {c['ms_per_token']:8.1f}  {low}  "
                f"resampling {k['resample_rate']:.3f} | {c['resample_rate']:.3f}"
            )
    print(f"wall {r['wall_s']:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
