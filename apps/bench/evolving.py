"""`python -m apps.bench evolving`: FlexSpec's Table II, generic vs anchor draft on evolved targets.

Per-token acceptance (accepted / drafted, `sd`, γ = 4; greedy and T = 1) of the generic draft
and of the anchor draft (runtime/anchor.py) against the base target, each LoRA-evolved target
in the evolved folder's `lora-*/` (merged at load, runtime/adapter.py) and each fully
fine-tuned one in its `full-*/`. The base is the embedded target (its evolved folder
runtime/assets/evolving/, the full fine-tune out/evolving/full-stdlib-tests/, not committed) or
any checkpoint (`--base smollm2-135m-instruct`: the folder evolving/NAME/ in Duet's cache,
~/.cache/duet/evolving/NAME/ by default (runtime/paths.py), built by the commands `--help` ends
with). A missing full fine-tune is reported with the command that
rebuilds it. `--head` adds the base's fitted feature-level head (apps.train eagle; PyTorch, so
it reads each target's own embedding and LM head): it drafts from the target's features, so it
has no end-to-end column (the edge has no target). Any `anchor-*/` folder beside `anchor/`
adds its rows as an ablation (`apps.train anchor --keep-first K`: the base's first K blocks
kept too). Prompts are held-out documents of each target's own domain (apps/train/domains.py;
the base's: the stdlib held-out files), each cut to its first `--prompt-tokens` tokens; as a
control, the base also runs on each evolved domain's prompts (rows carry `prompts`, the domain
the prompts come from). All targets run on the PyTorch backend, the generic and anchor drafts
on ONNX Runtime.

`ms_per_token` is end-to-end greedy `--method flexspec` over one named link (`--link`, default
4g): **emulated link time (virtual clock) + measured compute**, with the LoRA-evolved targets
as adapters of one verifier over the base (apps/bench/evolving_e2e.py says how; each row also
carries the link's share, `link_ms_per_token`). `--link none` leaves it null.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runtime import paths
from runtime.decoding import Sampling
from runtime.errors import DuetError, cli_main
from runtime.loading import load_pair
from runtime.session import GenerationSession

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "runtime/assets/default/target"
GENERIC = ROOT / "runtime/assets/default/draft"
EVOLVING = ROOT / "runtime/assets/evolving"
ANCHOR = EVOLVING / "anchor"
FULL = ROOT / "out/evolving/full-stdlib-tests"
FULL_CMD = (
    "python -m apps.train evolve --base runtime/assets/default/target --domain "
    "stdlib-tests --full --out out/evolving/full-stdlib-tests --time-budget-min 4 "
    "--threads 1 --steps 400"
)


def evolving_dir() -> Path:
    """Where a real base's evolved folders live: the cache's `evolving` (runtime/paths.py)."""
    return paths.cache_dir("evolving")


# how the evolved folder of a real base is built: 6-10 min a command for SmolLM2 on 2 cores (a
# step of 8 x 128 tokens took 7-9 s LoRA, 9-16 s full, 5 s anchor; docs/benchmarks.md, Table II)
REAL_RECIPE = (
    "  B={name}; E={evolved}\n"
    "  python -m apps.train evolve --base $B --domain licenses --out $E/lora-licenses"
    " --threads 2 --steps 45 --warmup 5\n"
    "  python -m apps.train evolve --base $B --domain stdlib-tests --out $E/lora-stdlib-tests"
    " --threads 2 --steps 45 --warmup 5\n"
    "  python -m apps.train evolve --base $B --domain stdlib-tests --full --lr 1e-4"
    " --out $E/full-stdlib-tests --threads 2 --steps 45 --warmup 5\n"
    "  python -m apps.train anchor --base $B --out $E/anchor --threads 2 --steps 100"
    " --time-budget-min 8\n"
    "  python -m apps.train anchor --base $B --keep-first 2 --out $E/anchor-first2 --threads 2"
    " --steps 100 --time-budget-min 8   # ablation\n"
    "  python -m apps.train draft-tune --target {name} --from-target-layers 0,1,{last}"
    " --out $E/generic --threads 2 --seq-len 128 --time-budget-min 8 --no-eval"
)


@dataclass(frozen=True)
class Setup:
    """What one Table II run compares: the base, its evolved folder, the drafts."""

    base: Path
    evolved: Path
    generic: Path
    full_cmd: str

    @property
    def anchor(self) -> Path:
        return self.evolved / "anchor"


def setup(base: str | None, evolved: str | None, generic: str | None) -> Setup:
    """The embedded base and its committed folder, or a named / local base with its own."""
    if base is None:
        return Setup(
            BASE,
            Path(evolved) if evolved else EVOLVING,
            Path(generic) if generic else GENERIC,
            FULL_CMD,
        )
    from runtime.loading import resolve

    bdir = resolve(base, "base")
    name = base if not Path(base).expanduser().exists() else bdir.name
    ev = Path(evolved).expanduser() if evolved else evolving_dir() / name
    full_cmd = (
        f"python -m apps.train evolve --base {bdir} --domain stdlib-tests --full --out "
        f"{ev}/full-stdlib-tests --lr 1e-4 --threads 2 --steps 45 --warmup 5"
    )
    if generic:
        gen = Path(generic).expanduser()
    else:
        found = sorted(ev.glob("generic*"))
        if not found:
            raise DuetError(
                f"no generic draft in {ev} (a generic*/ folder); pass --generic DIR, "
                f"or build the folder: `python -m apps.bench evolving --help` ends "
                f"with the commands"
            )
        gen = found[0]
    return Setup(bdir, ev, gen, full_cmd)


def targets(s: Setup | None = None, controls: bool = True) -> list[dict]:
    """[{name, dir, adapter, domain}], the base first; a missing full fine-tune is reported.

    With `controls`, the base target also runs on each evolved domain's prompts, so that a
    drop caused by the prompts' domain is told apart from one caused by the target's change.
    """
    s = s or setup(None, None, None)
    out = [{"name": "base", "dir": s.base, "adapter": None, "domain": "stdlib"}]
    for a in sorted(s.evolved.glob("lora-*")):
        out.append({"name": a.name, "dir": s.base, "adapter": a, "domain": a.name[len("lora-") :]})
    fulls = [f for f in sorted(s.evolved.glob("full-*")) if (f / "config.json").is_file()]
    if s.base == BASE and (FULL / "config.json").is_file():
        fulls.append(FULL)
    for f in fulls:  # full-<domain>
        out.append({"name": f.name, "dir": f, "adapter": None, "domain": f.name[len("full-") :]})
    if not fulls:
        print(f"full fine-tune missing; rebuild it with:\n  {s.full_cmd}", file=sys.stderr)
    if controls:
        for dom in dict.fromkeys(t["domain"] for t in out[1:]):
            out.append({"name": "base", "dir": s.base, "adapter": None, "domain": dom})
    return out


def domain_prompts(domain: str, tokenizer, n: int, prompt_tokens: int) -> list[list[int]]:
    """The first `prompt_tokens` tokens of the first `n` held-out documents of `domain`."""
    from apps.train.corpus import load_corpus
    from apps.train.domains import load_domain

    if domain == "stdlib":
        c = load_corpus()
        texts = (c.read(r) for r in c.heldout)
    else:
        d = load_domain(domain)
        texts = (d.read(r) for r in d.heldout)
    out = []
    for t in texts:
        ids = tokenizer.encode(t)
        if len(ids) >= prompt_tokens:
            out.append(ids[:prompt_tokens])
        if len(out) == n:
            break
    return out


def acceptance(pair, prompts, temp: float, max_new: int, gamma: int) -> float:
    """Accepted / drafted draft tokens of `sd` over all prompts (prompt i seeded i)."""
    # eos=(): every prompt runs its max_new tokens (no EOS cut), as the table was measured
    session = GenerationSession(
        pair, method="sd", options={"gamma": gamma}, eos=(), summarize=False
    )
    acc = drafted = 0
    for i, ids in enumerate(prompts):
        stats = None
        for r in session.stream(ids, max_new, sampling=Sampling(temp), seed=i):
            stats = r.stats
        acc += sum(stats.accepted)
        drafted += sum(stats.drafted)
    return acc / drafted if drafted else float("nan")


def run(a: argparse.Namespace) -> dict:
    s = setup(a.base, a.evolved, a.generic)
    if not (s.anchor / "anchor.json").is_file():
        raise DuetError(
            f"no anchor draft at {s.anchor}; train it with python -m apps.train "
            f"anchor --base {a.base or BASE.relative_to(ROOT)} --out {s.anchor}"
        )
    if not (s.generic / "config.json").is_file():
        raise DuetError(f"--generic {s.generic}: not a checkpoint directory (no config.json)")
    from apps.bench.evolving_e2e import Verifiers

    drafts = {"generic": s.generic, "anchor": s.anchor}
    for abl in sorted(s.evolved.glob("anchor?*")):  # ablations (--keep-first), named by folder
        if (abl / "anchor.json").is_file():
            drafts[abl.name] = abl
    if a.head:
        from runtime.drafts.head.torch import head_sidecar

        if not (head_sidecar(s.base) / "head.json").is_file():
            raise DuetError(
                f"--head: {s.base} has no fitted head ({head_sidecar(s.base)}); "
                f"fit one with python -m apps.train eagle --help"
            )
        drafts["head"] = "head"
    if a.drafts:
        want = a.drafts.split(",")
        if unknown := [d for d in want if d not in drafts]:
            raise DuetError(
                f"--drafts {','.join(unknown)}: not found; this run has {', '.join(drafts)}"
            )
        drafts = {d: drafts[d] for d in want}
    rows, t0 = [], time.monotonic()
    tlist = targets(s, not a.no_controls)
    lora = {t["adapter"].name: t["adapter"] for t in tlist if t["adapter"] is not None}
    verifiers = Verifiers({s.base: lora}, a.threads)
    try:
        for t in tlist:
            rows.extend(target_rows(a, t, drafts, verifiers, s.base))
    finally:
        verifiers.stop()
    settings = {"base": str(s.base), "evolved": str(s.evolved), "generic": str(s.generic),
                "method": "sd", "gamma": a.gamma, "prompts_per_target": a.prompts,
                "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens,
                "e2e": {"method": "flexspec", "link": a.link, "link_clock": "virtual",
                        "k": a.k if a.k is not None else "adaptive K* (eq. 11)", "codec": "ids",
                        "temp": 0, "threads": a.threads,
                        "ms_per_token": "emulated link time + measured compute"},
                "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    return {"rows": rows, "settings": settings}


def target_rows(a: argparse.Namespace, t: dict, drafts: dict, verifiers, base: Path):
    """The rows of one target: acceptance of each draft, then its end-to-end ms/token."""
    from apps.bench.evolving_e2e import ms_per_token

    prompts = None
    for dname, dpath in drafts.items():
        head = dpath == "head"  # the base's head, PyTorch: it reads this target's own weights
        pair = load_pair(
            str(t["dir"]),
            str(dpath),
            need_draft=True,
            target_backend="torch",
            adapter=str(t["adapter"]) if t["adapter"] else None,
            target_threads=a.threads,
            heads_from=base if head else None,
            draft_backend="torch" if head else None,
        )
        if prompts is None:
            prompts = domain_prompts(t["domain"], pair.tokenizer, a.prompts, a.prompt_tokens)
        row = {"draft": dname, "target": t["name"], "prompts": t["domain"]}
        for key, temp in (("acceptance_greedy", 0.0), ("acceptance_t1", 1.0)):
            row[key] = round(acceptance(pair, prompts, temp, a.max_tokens, a.gamma), 4)
        row["ms_per_token"] = None
        if a.link == "none":
            row["ms_per_token_reason"] = "--link none: no link to measure over"
        elif head:
            row["ms_per_token_reason"] = "the head drafts from the target's features: no edge run"
        else:  # the verifier of t's base, the session naming t's adapter
            row.update(
                ms_per_token(
                    verifiers,
                    Path(t["dir"]),
                    t["adapter"].name if t["adapter"] else "",
                    pair.draft,
                    prompts,
                    link=a.link,
                    max_new=a.max_tokens,
                    k=a.k,
                    eos=pair.target.config.eos_token_ids,
                )
            )
        print(
            f"{dname:8s} {t['name']:22s} {t['domain']:13s} greedy {row['acceptance_greedy']:.3f} "
            f"T=1 {row['acceptance_t1']:.3f} e2e {row['ms_per_token']} ms/tok",
            file=sys.stderr,
            flush=True,
        )
        yield row


def summary(rows: list[dict]) -> list[str]:
    """Table II's two claims, computed from the rows (greedy and T = 1)."""
    by = {(r["draft"], r["target"], r["prompts"]): r for r in rows}
    lines = []
    for key in ("acceptance_greedy", "acceptance_t1"):
        for r in rows:
            if r["target"] == "base":
                continue
            base = by[(r["draft"], "base", "stdlib")][key]
            same = by.get((r["draft"], "base", r["prompts"]))
            pct = f"{100 * r[key] / base:.0f} %" if base else "n/a"
            ctl = ""
            if same and same[key]:
                ctl = (
                    f"; base on {r['prompts']} prompts {same[key]:.3f} "
                    f"({100 * r[key] / same[key]:.0f} %)"
                )
            lines.append(
                f"{key} {r['draft']:8s} {r['target']:22s} {r[key]:.3f} = "
                f"{pct} of its base {base:.3f}{ctl}"
            )
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m apps.bench evolving",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A real base's evolved folder (SmolLM2 shown; then run "
        "with --base NAME --head):\n"
        + REAL_RECIPE.format(
            name="smollm2-135m-instruct", last=29, evolved=evolving_dir() / "smollm2-135m-instruct"
        ),
    )
    ap.add_argument(
        "--base",
        default=None,
        help="base target: a checkpoint or a known model's name (default: the embedded target)",
    )
    ap.add_argument(
        "--evolved",
        default=None,
        help="folder of the evolved targets (lora-*/, full-*/) and the anchor "
        "(anchor/) (default: runtime/assets/evolving for the embedded base, "
        f"{evolving_dir()}/NAME otherwise)",
    )
    ap.add_argument(
        "--generic",
        default=None,
        help="the generic draft (default: the embedded draft, or EVOLVED/generic*)",
    )
    ap.add_argument(
        "--head",
        action="store_true",
        help="add the base's fitted feature-level head (acceptance only)",
    )
    ap.add_argument(
        "--drafts",
        default=None,
        help="comma-separated drafts to run, of generic, anchor, anchor-*, head "
        "(default: every one found)",
    )
    ap.add_argument("--prompts", type=int, default=10, help="held-out prompts per target (10)")
    ap.add_argument("--prompt-tokens", type=int, default=48, help="tokens per prompt (48)")
    ap.add_argument("--max-tokens", type=int, default=48, help="new tokens per prompt (48)")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per step (4)")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch target threads (1)")
    ap.add_argument(
        "--link",
        default="4g",
        help="named link of the end-to-end flexspec column: 5g, 4g, wifi-weak, none "
        "(default 4g; its time is emulated on a virtual clock)",
    )
    ap.add_argument(
        "--k",
        type=int,
        default=None,
        help="end-to-end: fixed draft length K (default adaptive K*, eq. 11)",
    )
    ap.add_argument(
        "--no-controls",
        action="store_true",
        help="skip the base target on each evolved domain's prompts",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if min(a.prompts, a.prompt_tokens, a.max_tokens, a.gamma, a.threads) < 1:
        raise DuetError("--prompts, --prompt-tokens, --max-tokens, --gamma, --threads must be >= 1")
    from devices.links import LINK_NAMES

    if a.link not in LINK_NAMES:
        raise DuetError(f"unknown --link {a.link!r}; choose from {', '.join(LINK_NAMES)}")
    if a.k is not None and a.k < 1:
        raise DuetError(f"--k must be at least 1 (got {a.k})")
    res = run(a)
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        f"{'draft':8s} {'target':22s} {'prompts':13s} {'acc greedy':>10s} {'acc T=1':>8s}  "
        f"ms/token ({a.link}: emulated link time + measured compute)"
    )
    for r in res["rows"]:
        e2e = (
            f"{r['ms_per_token']:8.1f} (link {r['link_ms_per_token']:.1f})"
            if r["ms_per_token"] is not None
            else f"null ({r['ms_per_token_reason']})"
        )
        print(
            f"{r['draft']:8s} {r['target']:22s} {r['prompts']:13s} {r['acceptance_greedy']:10.3f} "
            f"{r['acceptance_t1']:8.3f}  {e2e}"
        )
    print("\n".join(summary(res["rows"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
