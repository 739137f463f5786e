"""Named wireless link conditions (FlexSpec §V: 5G strong, 4G average, weak WiFi) and block fading.

A `Link` is the uplink rate R_n, the round-trip time and the fading that the
latency models (`devices.latency`) and the emulated channel need. Every number
carries its source. How the RTTs were derived:

  FlexSpec reports only end-to-end latencies. Its Cloud-Only baseline pays one
  full round trip plus one cloud decode step per token (§V-A, "every token
  generation incurs a full network round-trip time and cloud computation
  cost"), so RTT = Cloud-Only latency (Table III, GSM8K, T = 0) − the cloud's
  decode step. The cloud step is the roofline time of Llama-2-70B (bf16) on
  FlexSpec's 8× A800 node: 137.4e9 B / (8 × 2039e9 B/s) = 8.43 ms, the
  `t_base` of devices/profiles/a800.toml. Table IV (T = 1) gives the same
  round trips within 5 ms (435 / 598 / 1225 ms).

The rates are FlexSpec Table I's link bandwidths; the mean SNR and fading
follow CU-HLM §V (10 dB average SNR, Rayleigh; Rician K = 10 dB) except weak
WiFi, whose SNR is FlexSpec §III-D's "SNR < 5 dB".

Under block fading (CU-HLM §II-B) the gain |h|² is drawn once per round; the
round's rate is W·log2(1 + SNR·|h|²) (CU-HLM eq. (5)), with W chosen so that the
rate at the mean SNR equals the nominal rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from devices.latency import shannon_rate
from runtime.errors import DuetError

OUTAGE_FLOOR = 0.01  # a round's rate never falls below 1 % of nominal (see Link.sample_rate)
A800_T_BASE_S = 8.425e-3  # devices/profiles/a800.toml t_base (Llama-2-70B on 8x A800, roofline)


@dataclass(frozen=True)
class Link:
    """One named link condition: nominal uplink rate, RTT, mean SNR and fading, with sources."""

    name: str
    description: str
    rate_bps: float
    rtt_s: float
    mean_snr_db: float
    fading: str  # "none" | "rayleigh" | "rician"
    rician_k_db: float | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def bandwidth_hz(self) -> float:
        """W such that W·log2(1 + mean SNR) is the nominal rate."""
        return self.rate_bps / math.log2(1.0 + 10 ** (self.mean_snr_db / 10))

    def sample_rate(self, rng: np.random.Generator) -> float:
        """One block-fading round's Shannon rate (bit/s): W·log2(1 + SNR·|h|²), CU-HLM eq. (5).

        Floored at OUTAGE_FLOOR of the nominal rate: a deep fade is an outage that a real link
        rides out by retransmission, which this model does not simulate.
        """
        if math.isinf(self.rate_bps):
            return self.rate_bps
        snr = 10 ** (self.mean_snr_db / 10) * fading_gain(rng, self.fading, self.rician_k_db)
        rate = shannon_rate(self.bandwidth_hz, snr)  # CU-HLM eq. (5) under block fading
        return max(rate, OUTAGE_FLOOR * self.rate_bps)

    def mean_inverse_rate(self, n: int = 400) -> float:
        """E[1/R] in s/bit over the block-fading law (floored as in `sample_rate`), by
        deterministic quadrature on n (Rayleigh) or n² (Rician) quantile points. A round's
        expected serialization time is bits · E[1/R] (FlexSpec eq. (8) averaged over the
        fading)."""
        if math.isinf(self.rate_bps):
            return 0.0
        u = (np.arange(n) + 0.5) / n  # mid-quantiles
        if self.fading == "none":
            g = np.ones(1)
        elif self.fading == "rayleigh":
            g = -np.log1p(-u)  # Exp(1) quantiles
        else:
            z = np.array([NormalDist().inv_cdf(x) for x in u])
            k = 10 ** ((self.rician_k_db or 0.0) / 10)
            los, sigma = math.sqrt(k / (k + 1)), math.sqrt(1 / (2 * (k + 1)))
            g = ((los + sigma * z[:, None]) ** 2 + (sigma * z[None, :]) ** 2).ravel()
        snr = 10 ** (self.mean_snr_db / 10) * g
        rate = np.maximum(self.bandwidth_hz * np.log2(1.0 + snr), OUTAGE_FLOOR * self.rate_bps)
        return float(np.mean(1.0 / rate))  # CU-HLM eq. (5) rate, inverted and averaged

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "rate_bps": self.rate_bps,
            "rtt_s": self.rtt_s,
            "mean_snr_db": self.mean_snr_db,
            "fading": self.fading,
            "rician_k_db": self.rician_k_db,
            "sources": dict(self.sources),
        }


def fading_gain(rng: np.random.Generator, fading: str, rician_k_db: float | None = None) -> float:
    """|h|² with E|h|² = 1: 1 (none), Exp(1) (Rayleigh), or non-central chi-square (Rician K)."""
    if fading == "none":
        return 1.0
    if fading == "rayleigh":
        return float(rng.exponential(1.0))
    if fading == "rician":
        k = 10 ** ((rician_k_db or 0.0) / 10)
        los = math.sqrt(k / (k + 1))  # line-of-sight amplitude
        sigma = math.sqrt(1 / (2 * (k + 1)))  # scattered part, per real dimension
        h = complex(los + sigma * rng.standard_normal(), sigma * rng.standard_normal())
        return abs(h) ** 2
    raise ValueError(f"unknown fading {fading!r}")


def _rtt(cloud_only_ms: float) -> float:
    return cloud_only_ms / 1e3 - A800_T_BASE_S


_RTT_SOURCE = (
    "derived: FlexSpec Table III Cloud-Only latency (GSM8K, T=0) {co} ms minus the cloud "
    "decode step 8.43 ms (roofline, devices/profiles/a800.toml t_base)"
)

_CU_HLM_SNR = "CU-HLM §V (Fig. 1, Table II): average SNR 10 dB"


def _flexspec_link(
    name: str,
    label: str,
    mbps: float,
    table_i: str,
    cloud_only_ms: float,
    snr_db: float,
    snr_source: str,
    fading: str,
    fading_source: str,
    rician_k_db: float | None = None,
) -> Link:
    """One of FlexSpec §V's links: Table I's rate (`table_i` names its row), the RTT derived
    from Table III's Cloud-Only latency, and the SNR and fading with their sources."""
    return Link(
        name=name,
        description=f"{label}, FlexSpec §V",
        rate_bps=mbps * 1e6,
        rtt_s=_rtt(cloud_only_ms),
        mean_snr_db=snr_db,
        fading=fading,
        rician_k_db=rician_k_db,
        sources={
            "rate_bps": f"FlexSpec Table I: {table_i} {mbps:g} Mbps",
            "rtt_s": _RTT_SOURCE.format(co=cloud_only_ms),
            "mean_snr_db": snr_source,
            "fading": fading_source,
        },
    )


LINKS: dict[str, Link] = {
    "5g": _flexspec_link("5g", "5G (Strong)", 300, "5G Mid-Band", 432.0, 10.0, _CU_HLM_SNR,
                         "rician", "CU-HLM §V Fig. 10b: Rician fading, K = 10 dB (line of sight: "
                         "the strong case)", rician_k_db=10.0),
    "4g": _flexspec_link("4g", "4G (Avg)", 50, "4G LTE", 595.0, 10.0, _CU_HLM_SNR,
                         "rayleigh", "CU-HLM §V Fig. 10a / Table II: Rayleigh fading"),
    "wifi-weak": _flexspec_link("wifi-weak", "WiFi (Weak)", 10, "Public WiFi", 1220.0, 5.0,
                                "FlexSpec §III-D: weak-signal scenarios, SNR < 5 dB", "rayleigh",
                                "CU-HLM §V Fig. 10a: Rayleigh fading (no line of sight)"),
}  # fmt: skip


NONE = Link(
    name="none",
    description="no emulation: loopback as it is",
    rate_bps=math.inf,
    rtt_s=0.0,
    mean_snr_db=math.inf,
    fading="none",
    sources={"all": "no link model: the real socket's own time only"},
)
LINK_NAMES = ("none", *LINKS)  # what --link accepts


class LinkEmulator:
    """A link applied round by round: `start_round()` draws the round's block-fading rate;
    `uplink_s(n)` / `downlink_s(n)` are the seconds n real bytes take (propagation RTT/2 plus
    serialization 8n / rate, FlexSpec eq. (8)), which the client waits with `wait(s)`. The
    downlink uses the round's rate too (FlexSpec's T_down; the verdict is a few bytes, so it is
    ≈ RTT/2).

    `virtual=True` (the bench's `--link-clock virtual`) does not sleep: `wait` adds the seconds
    to `virtual_s`, which the caller adds to its measured wall time. The edge loop is strictly
    serial (draft, send, wait, verify, wait, apply), so this gives the same per-round times as
    sleeping, minus the OS's oversleep, and lets a bench run ten times the rounds in the same
    hours. What is computed stays measured; only the link's waits are emulated, as before."""

    def __init__(self, link: Link, seed: int = 0, virtual: bool = False):
        self.link = link
        self.rng = np.random.default_rng(seed)
        self.rate_bps = link.rate_bps
        self.virtual = virtual
        self.virtual_s = 0.0  # seconds waited on the virtual clock so far

    def wait(self, seconds: float) -> None:
        """Wait out `seconds` of link time: a real sleep, or on the virtual clock."""
        if self.virtual:
            self.virtual_s += seconds
        else:
            time.sleep(seconds)

    def start_round(self) -> float:
        """Draw this round's rate (bit/s) and return it."""
        self.rate_bps = self.link.sample_rate(self.rng)  # block fading: one gain per round
        return self.rate_bps

    def uplink_s(self, nbytes: int) -> float:
        """T_up = T_prop + 8·bytes / R_n (FlexSpec eq. (8), with the frame's real length)."""
        return self.link.rtt_s / 2 + 8 * nbytes / self.rate_bps  # eq. (8)

    def downlink_s(self, nbytes: int) -> float:
        """T_down = T_prop + 8·bytes / R_n."""
        return self.link.rtt_s / 2 + 8 * nbytes / self.rate_bps


def emulator(name: str, seed: int = 0, virtual: bool = False) -> LinkEmulator | None:
    """The emulator for a named link; None for `none` (nothing to emulate). `virtual`: keep
    the link's waits on a virtual clock instead of sleeping (see LinkEmulator)."""
    link = get_link(name)
    return None if link.name == "none" else LinkEmulator(link, seed, virtual)


def get_link(name: str) -> Link:
    """A named link condition, or a DuetError listing the names."""
    if name == "none":
        return NONE
    if name not in LINKS:
        raise DuetError(f"unknown link {name!r}; choose from {', '.join(LINK_NAMES)}")
    return LINKS[name]
