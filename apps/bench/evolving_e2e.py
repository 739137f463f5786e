"""End-to-end FlexSpec ms/token for `python -m apps.bench evolving`: the edge drafts here, the
evolving cloud verifies over one named emulated link.

The cloud is real verifier processes (`python -m apps.cloud serve`, started on 127.0.0.1 by
runtime/edge/local.py): one holds the base target and every LoRA-evolved target as an adapter
over the same backbone (a session names its adapter at OPEN, PROTOCOL.md), so "the cloud
evolves" without the edge changing anything but that name; a fully fine-tuned target is another
base and gets a verifier of its own. Each run is greedy `--method flexspec` with the ids codec
and adaptive K* (eq. 11) or a fixed K, one fresh session per prompt, the link seeded by the
prompt's index (the same fading for every draft and target).

What ms/token means here: **emulated link time + measured compute**. The link emulator runs on
its virtual clock (devices.links.emulator(..., virtual=True)): its uplink/downlink waits are
added to the measured time instead of slept (the edge loop is serial, so the per-round sum is
the same), and everything else (drafting, framing, loopback TCP, the verifier's forward) is
measured wall time on this machine. It does not measure acceptance
(apps/bench/evolving_rows.py).
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError


class Verifiers:
    """Verifier processes keyed by base directory, started on first use; `stop()` ends them."""

    def __init__(self, adapters: dict[Path, dict[str, Path]], threads: int):
        self.adapters = adapters  # base dir -> {name: adapter dir} that verifier holds
        self.threads = threads
        self.running: dict[Path, object] = {}

    def get(self, base: Path):
        """(host, port, token) of the verifier serving `base` (and its adapters)."""
        from runtime.edge.local import LocalVerifier

        if base not in self.running:
            extra = ["--target-threads", str(self.threads)]
            for name, d in self.adapters.get(base, {}).items():
                extra += ["--adapter", f"{name}={d}"]
            self.running[base] = LocalVerifier(
                base, target_backend="torch", extra_args=tuple(extra)
            )
        v = self.running[base]
        return v.host, v.port, v.token

    def stop(self) -> None:
        for v in self.running.values():
            v.stop()
        self.running.clear()


def ms_per_token(
    verifiers: Verifiers,
    base: Path,
    adapter: str,
    draft,
    prompts,
    *,
    link: str,
    max_new: int,
    k: int | None,
    eos,
) -> dict:
    """{ms_per_token, link_ms_per_token, e2e_tokens, e2e_mean_k, e2e_acceptance} of greedy
    flexspec with `draft` against `base` (+ `adapter` by name, "" for the base) over `prompts`;
    like apps.bench edge, the clock runs from OPEN (the connection's HELLO is not counted)."""
    from apps.bench.edge_run import one_run
    from devices.links import emulator
    from runtime.decoding.events import GREEDY
    from runtime.edge.client import Connection

    host, port, token = verifiers.get(base)
    wall = link_s = 0.0
    toks = rounds = drafted = accepted = 0
    for i, prompt in enumerate(prompts):
        emu = emulator(link, i, virtual=True)
        if emu is None:
            raise DuetError(f"--link {link}: the end-to-end column needs an emulated link")

        hello_s = []

        def factory(emu=emu, hello_s=hello_s):
            conn = Connection(host, port, token, link=emu, adapter=adapter)
            hello_s.append(emu.virtual_s)  # one_run's clock starts here: HELLO is not counted
            return conn

        out, w, edge = one_run(factory, draft, prompt, max_new, GREEDY, i, k, eos)
        wall, link_s, toks = wall + w, link_s + emu.virtual_s - hello_s[0], toks + len(out)
        rounds += edge["rounds"]
        drafted, accepted = drafted + sum(edge["k"]), accepted + sum(edge["accepted"])
    if toks == 0:
        raise DuetError("flexspec produced no tokens (every prompt ended at once)")
    return {
        "ms_per_token": round(1e3 * wall / toks, 2),
        "link_ms_per_token": round(1e3 * link_s / toks, 2),
        "e2e_tokens": toks,
        "e2e_mean_k": round(drafted / max(1, rounds), 2),
        "e2e_acceptance": round(accepted / max(1, drafted), 4),
    }
