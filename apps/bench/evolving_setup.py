"""What `python -m apps.bench evolving` compares: the base, its evolved targets, the drafts.

Where the base and its evolved folder are (the embedded pair's committed one, or Duet's cache
`evolving/NAME/` for a named base, runtime/paths.py), the command lines that build a real base's
folder, the list of targets found in it, and the held-out prompts of each target's domain.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from runtime import paths
from runtime.errors import DuetError

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
