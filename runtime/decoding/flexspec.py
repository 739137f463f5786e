"""`flexspec`: edge-cloud speculative decoding (FlexSpec §IV-C). The draft runs here; a cloud
verifier (python -m apps.cloud serve) holds the target and checks each window over the network.

The method-table entry only: the loop is runtime/edge/loop.py. The `target` argument is unused
(the cloud holds the target); the command layer passes a connected `Connection` (options.conn),
the link emulator inside it, and the K controller.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from runtime.arg_rules import at_least
from runtime.decoding.events import StepCall, StepEvent, option_keywords
from runtime.errors import DuetError

NEEDS_DRAFT = True
RUNS_HYBRID = (
    "target",
    "draft",
)  # the verifier trims a HybridCache like any cache (FlexSpec §IV-C)


@dataclass
class Options:
    conn: object = None  # runtime.edge.client.Connection, said HELLO
    k: int | None = None  # fixed K (the ablation); None: the controller's K*
    k_max: int = 8  # bound on K
    controller: object = None  # devices.kstar.AdaptiveK (eq. (11)); None: K = 4
    codec: str | None = None  # payload codec; default ids at T = 0, raw at T > 0
    codec_params: dict | None = None  # a compressed-q codec's parameters (its DEFAULTS otherwise)
    skip: object = None  # runtime.edge.skip.SkipRule: CU-HLM's LOSSY skipping (--skip); None: off
    bit_budget: int | None = None  # SQS §4's per-batch uplink bits B (k-sqs, c-sqs); None: off


def check(options: Options) -> None:
    """K's bounds (the edge flags' other checks: runtime/edge/cli_args.py check_edge_args)."""
    at_least("--k", options.k, 0)
    at_least("--k-max", options.k_max)


def summarize(
    events, timeline, *, options=None, pair=None, prompt=(), out=(), sampling=None, **run
) -> dict:
    """stats.edge (per-round figures), `lossy`, and with CU-HLM skipping (options.skip) the
    skip rate and the rejection risk R audited against the target when it is loaded here
    (runtime/edge/skip.py says how)."""
    from runtime.edge.loop import edge_summary

    rule = getattr(options, "skip", None)
    s = {"edge": edge_summary(events), "lossy": rule is not None}
    if rule is None:
        return s
    from runtime.edge.skip import audit, skip_summary, skipped_positions

    prompt, out = list(prompt), list(out)
    if (getattr(pair, "settings", None) or {}).get("target_backend") == "remote":
        why = "no target loaded here (remote verifier without --target)"
        s["skip"] = skip_summary(events, rule, len(out), None, why)
        return s
    pos, xs = skipped_positions(events, len(prompt), len(out))
    betas = audit(pair.target, prompt + out, pos, xs, sampling)
    s["skip"] = skip_summary(events, rule, len(out), betas)
    return s


def steps(c: StepCall) -> Iterator[StepEvent]:
    """The method-table entry point (runtime.decoding.METHOD_MODULES)."""
    from runtime.edge.loop import edge_steps

    o = c.options
    if o.conn is None:
        raise DuetError("--method flexspec needs a cloud verifier (--server HOST:PORT or local)")
    kw = c.keywords("seed", "draft_cache")
    return edge_steps(c.draft, o.conn, c.seq, **kw, **option_keywords(o, drop=("conn",)))
