"""python -m devices: list, show, calibrate and predict with device profiles.

list [--json]                         the shipped profiles, each with its figures' sources
show NAME|FILE [--json]               one profile, as written (TOML) or parsed (JSON)
calibrate --out FILE [--model DIR | --target DIR --draft DIR] [--target-backend B
          [--quantize Q]] [--draft-backend B] [--k-max K] [--repeats R] [--name NAME]
                                      measure this machine, fit the latency parameters,
                                      write a profile
latency --profile NAME --link 5g|4g|wifi-weak [--gamma-hat G] [--k-max K]
        [--acceptance geometric|alg2] [--bits-per-token B] [--json]
                                      FlexSpec step time for each K and K* (eq. (7)-(11))
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from runtime.errors import DuetError, cli_main

DEFAULT_PAIR = Path(__file__).resolve().parent.parent / "runtime" / "assets" / "default"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one stderr line, no usage block
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def list_profiles() -> list[dict]:
    """Every shipped profile as {name, description, kind, draft, target, bandwidth_gb_s,
    sources}."""
    from devices.profile import load_all

    return [
        {
            "name": p.name,
            "description": p.description,
            "kind": p.kind,
            "draft": f"{p.draft.backend}/{p.draft.provider}",
            "target": f"{p.target.backend}/{p.target.provider}"
            + (f" {p.target.quantize}" if p.target.quantize != "none" else ""),
            "bandwidth_gb_s": p.bandwidth.value * p.count.value,
            "sources": p.sources(),
        }
        for p in load_all()
    ]


def latency_table(
    profile_name: str,
    link_name: str,
    *,
    gamma_hat: float = 0.8,
    k_max: int = 8,
    acceptance: str = "geometric",
    bits_per_token: float | None = None,
) -> dict:
    """FlexSpec's predicted step time for K = 1..k_max on a profile and link, and K* (eq. (11)).

    Also the shift analysis: the ratio T_marginal / T_fixed at which K* falls to 2 (the paper's
    Fig. 2 weak-signal value) and the per-token payload that would take this link there.
    """
    from devices import latency as L
    from devices.links import get_link
    from devices.profile import load_profile

    if not 0.0 <= gamma_hat <= 1.0:
        raise DuetError(f"--gamma-hat must be in [0, 1], got {gamma_hat}")
    if k_max < 1:
        raise DuetError(f"--k-max must be >= 1, got {k_max}")
    prof, link = load_profile(profile_name), get_link(link_name)
    if bits_per_token is not None and bits_per_token <= 0:
        raise DuetError(f"--bits-per-token must be positive, got {bits_per_token}")
    p = L.FlexSpecParams(*(prof.param(k) for k in ("alpha_edge", "beta", "delta_cloud", "t_base")))
    if bits_per_token is not None:
        p = L.FlexSpecParams(p.alpha_edge, p.beta, p.delta_cloud, p.t_base, bits_per_token)
    t_fixed, t_marg = L.flexspec_terms(p, link.rate_bps, link.rtt_s)
    r2 = ratio_for_k(2, gamma_hat, k_max, acceptance)
    need_bits = max(0.0, (r2 * t_fixed - p.alpha_edge - p.delta_cloud) * link.rate_bps)
    steps = []
    for k in range(1, k_max + 1):
        t = L.flexspec_step_time(k, p, link.rate_bps, link.rtt_s)
        tau = L.expected_accepted(k, gamma_hat, acceptance)
        steps.append({"k": k, "step_time_s": t, "expected_accepted": tau, "tokens_per_s": tau / t})
    return {
        "profile": prof.name,
        "link": link.to_dict(),
        "params": {
            "alpha_edge": p.alpha_edge,
            "beta": p.beta,
            "delta_cloud": p.delta_cloud,
            "t_base": p.t_base,
            "bits_per_token": p.bits_per_token,
            "header_bits": p.header_bits,
        },
        "gamma_hat": gamma_hat,
        "acceptance": acceptance,
        "t_fixed_s": t_fixed,
        "t_marginal_s": t_marg,
        "steps": steps,
        "k_star": L.k_star(t_fixed, t_marg, gamma_hat, k_max, acceptance),
        "shift": {
            "ratio": t_marg / t_fixed,
            "ratio_for_k_star_2": r2,
            "bits_per_token_for_k_star_2": need_bits,
        },
    }


def ratio_for_k(k: int, gamma_hat: float, k_max: int, acceptance: str) -> float:
    """The smallest T_marginal / T_fixed at which eq. (11)'s K* is at most k (bisection)."""
    from devices.latency import k_star

    lo, hi = 0.0, 1.0
    while k_star(1.0, hi, gamma_hat, k_max, acceptance) > k and hi < 1e6:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if k_star(1.0, mid, gamma_hat, k_max, acceptance) <= k else (mid, hi)
    return hi


def calibrate(
    out: str,
    *,
    model: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    target_backend: str = "mlx",
    draft_backend: str = "mlx",
    quantize: str = "int4",
    k_max: int = 8,
    repeats: int = 5,
    name: str | None = None,
    progress: bool = True,
) -> dict:
    """Measure this machine on a target/draft pair, write the fitted profile to `out`, return it."""
    import converters  # noqa: F401 (a draft directory on ONNX is exported on the fly)
    from devices.calibrate import run_calibration, to_profile
    from devices.profile import read_profile_file
    from devices.profile_toml import dumps_toml
    from runtime.backends import load_model
    from runtime.testing.random_checkpoint import make_checkpoint

    out_path = Path(out)
    if out_path.suffix not in (".toml", ".json"):
        raise DuetError(f"--out {out}: expected a .toml or .json file name")
    if k_max < 2 or repeats < 1:
        raise DuetError(f"--k-max must be >= 2 and --repeats >= 1 (got {k_max}, {repeats})")
    with tempfile.TemporaryDirectory(prefix="duet-calibrate-") as tmp:
        if model:
            target_dir = draft_dir = Path(model)
        elif target or draft:
            if not (target and draft):
                raise DuetError(
                    "give both --target and --draft, or --model for one model in both roles"
                )
            target_dir, draft_dir = Path(target), Path(draft)
        elif (DEFAULT_PAIR / "target").is_dir() and (DEFAULT_PAIR / "draft").is_dir():
            target_dir, draft_dir = DEFAULT_PAIR / "target", DEFAULT_PAIR / "draft"
        else:  # no embedded pair in this checkout: calibrate on tiny random models
            tiny = dict(vocab_size=512, max_context=512, initializer_range=0.02)
            target_dir = make_checkpoint(
                Path(tmp) / "target", hidden_size=256, num_layers=8, intermediate_size=512, **tiny
            )
            draft_dir = make_checkpoint(
                Path(tmp) / "draft",
                hidden_size=128,
                num_layers=2,
                intermediate_size=256,
                seed=1,
                **tiny,
            )
        if target_backend == "onnx":  # the ONNX Runtime target, its weights `quantize`d
            from runtime.backends.onnx.target import OnnxTargetLM

            tgt = OnnxTargetLM(target_dir, quantize)
        else:
            tgt = load_model(target_dir, target_backend)
        drf = load_model(draft_dir, draft_backend)
        cal = run_calibration(tgt, drf, k_max=k_max, repeats=repeats, progress=progress)
    provider = {"mlx": _mlx_device(), "onnx": "cpu", "torch": "cpu", "coreml": "all"}
    data = to_profile(
        cal,
        name=name or out_path.stem,
        target_desc=_describe(target_dir, tgt),
        draft_desc=_describe(draft_dir, drf),
        target_backend=target_backend,
        draft_backend=draft_backend,
        target_provider=provider[target_backend],
        draft_provider=provider[draft_backend],
        target_quantize=quantize if target_backend == "onnx" else "none",
    )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.suffix == ".json":
        out_path.write_text(json.dumps(data, indent=2) + "\n")
    else:
        out_path.write_text(
            dumps_toml(data, "Duet device profile written by `python -m devices calibrate`.")
        )
    read_profile_file(out_path)  # what we wrote must load
    return {"profile": data, "calibration": cal}


def _mlx_device() -> str:
    import mlx.core as mx

    return "gpu" if mx.default_device() == mx.gpu else "cpu"


def _describe(d: Path, m) -> str:
    c = m.config
    tag = (
        d.name
        if d.name not in ("target", "draft") or "duet-calibrate" not in str(d)
        else f"tiny random {d.name}"
    )
    return f"{tag} ({c.model_type}, {c.num_layers} layers, hidden {c.hidden_size})"


def _print_latency(t: dict) -> None:
    link = t["link"]
    print(
        f"{t['profile']} over {link['name']} ({link['description']}): "
        f"rate {link['rate_bps'] / 1e6:g} Mbit/s, RTT {link['rtt_s'] * 1e3:.1f} ms, "
        f"{link['fading']} fading, mean SNR {link['mean_snr_db']:g} dB"
    )
    p = t["params"]
    print(
        f"alpha_edge {p['alpha_edge'] * 1e3:.3f} ms, beta {p['beta'] * 1e3:.3f} ms, "
        f"delta_cloud {p['delta_cloud'] * 1e3:.4f} ms, t_base {p['t_base'] * 1e3:.3f} ms; "
        f"T_fixed {t['t_fixed_s'] * 1e3:.2f} ms, "
        f"T_marginal {t['t_marginal_s'] * 1e3:.4f} ms  (eq. 10)"
    )
    print(
        f"{'K':>3} {'step ms':>10} {'E[tau]':>7} {'tok/s':>8}   "
        f"({t['acceptance']}, gamma_hat {t['gamma_hat']})"
    )
    for s in t["steps"]:
        mark = "  <- k_star" if s["k"] == t["k_star"] else ""
        print(
            f"{s['k']:>3} {s['step_time_s'] * 1e3:>10.2f} {s['expected_accepted']:>7.2f} "
            f"{s['tokens_per_s']:>8.2f}{mark}"
        )
    print(f"k_star = {t['k_star']}")
    sh = t["shift"]
    print(f"RTT: {link['sources']['rtt_s']}")
    print(
        f"shift: T_marginal/T_fixed = {sh['ratio']:.4f}; K* <= 2 (FlexSpec Fig. 2, weak signal) "
        f"needs >= {sh['ratio_for_k_star_2']:.3f}, i.e. >= {sh['bits_per_token_for_k_star_2']:.3g} "
        f"bits per drafted token on this link (the payload here is {p['bits_per_token']:g})"
    )


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.cmd == "list":
        rows = list_profiles()
        if a.json:
            print(json.dumps(rows, indent=2))
        else:
            for r in rows:
                print(
                    f"{r['name']:<20} {r['kind']:<6} {r['bandwidth_gb_s']:>8.1f} GB/s  "
                    f"draft {r['draft']:<18} target {r['target']}"
                )
    elif a.cmd == "show":
        from devices.profile import load_profile

        p = load_profile(a.name)
        print(
            json.dumps(p.raw, indent=2) if a.json else p.path.read_text(),
            end="\n" if a.json else "",
        )
    elif a.cmd == "calibrate":
        _run_calibrate(a)
    else:
        t = latency_table(
            a.profile,
            a.link,
            gamma_hat=a.gamma_hat,
            k_max=a.k_max,
            acceptance=a.acceptance,
            bits_per_token=a.bits_per_token,
        )
        if a.json:
            print(json.dumps(t, indent=2))
        else:
            _print_latency(t)
    return 0


def _parser() -> argparse.ArgumentParser:
    from devices.links import LINKS

    ap = _Parser(
        prog="python -m devices",
        description="Duet device profiles, calibration and latency models.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    s = sub.add_parser("list", help="list the shipped profiles")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("show", help="print one profile")
    s.add_argument("name", help="profile name or .toml/.json path")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("calibrate", help="measure this machine and write a profile")
    s.add_argument("--out", required=True, help="profile file to write (.toml or .json)")
    s.add_argument("--model", help="one checkpoint directory used as both target and draft")
    s.add_argument("--target", help="target checkpoint directory")
    s.add_argument("--draft", help="draft checkpoint directory")
    s.add_argument("--target-backend", default="mlx", choices=("mlx", "torch", "onnx"))
    s.add_argument(
        "--quantize",
        default="int4",
        choices=("int4", "int8", "none"),
        help="the ONNX target's weights (--target-backend onnx)",
    )
    s.add_argument("--draft-backend", default="mlx", choices=("mlx", "torch", "onnx"))
    s.add_argument("--k-max", type=int, default=8)
    s.add_argument("--repeats", type=int, default=5)
    s.add_argument("--name", help="profile name (default: the output file's stem)")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--json", action="store_true", help="print the written profile as JSON")
    s = sub.add_parser("latency", help="FlexSpec step time per K and K* on a profile and link")
    s.add_argument("--profile", required=True)
    s.add_argument("--link", required=True, choices=list(LINKS))
    s.add_argument(
        "--bits-per-token",
        type=float,
        default=None,
        help="uplink bits per drafted token (default 15: FlexSpec's ids)",
    )
    s.add_argument(
        "--gamma-hat", type=float, default=0.8, help="EMA acceptance (Alg. 2 starts at 0.8)"
    )
    s.add_argument("--k-max", type=int, default=8)
    s.add_argument(
        "--acceptance",
        default="geometric",
        choices=("alg2", "geometric"),
        help="E[tau|K]: geometric (bounded, default) or alg2 (1 + gamma_hat K)",
    )
    s.add_argument("--json", action="store_true")
    return ap


def _run_calibrate(a: argparse.Namespace) -> None:
    """`calibrate`: measure, write the profile, print its fitted parameters (or the JSON)."""
    from runtime.preflight import writable_file

    writable_file(a.out, "--out")
    res = calibrate(
        a.out,
        model=a.model,
        target=a.target,
        draft=a.draft,
        target_backend=a.target_backend,
        draft_backend=a.draft_backend,
        quantize=a.quantize,
        k_max=a.k_max,
        repeats=a.repeats,
        name=a.name,
        progress=not a.no_progress,
    )
    prof = res["profile"]
    if a.json:
        print(json.dumps(prof, indent=2))
        return
    lat = prof["latency"]
    print(f"wrote {a.out}: {prof['description']}")
    for k in (
        "alpha_edge",
        "beta",
        "t_base",
        "delta_cloud",
        "c_layer",
        "c_layer_per_token",
        "t_rv",
    ):
        r2 = f"  R² {lat[k]['r2']:.3f}" if "r2" in lat[k] else ""
        print(f"  {k:<18} {lat[k]['value'] * 1e3:>10.4f} ms{r2}")
    print(
        f"  bandwidth {prof['memory']['bandwidth']['value']:.1f} GB/s, "
        f"peak {prof['accelerators']['cpu']['peak']['value'] * 1e3:.1f} GFLOP/s"
    )


if __name__ == "__main__":
    sys.exit(main())
