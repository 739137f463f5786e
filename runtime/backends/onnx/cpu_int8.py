"""Which int8 matmul path ONNX Runtime's CPU provider takes on this CPU, and whether a
full-range U8S8 (uint8 activations x int8 weights) artefact is safe on it.

On x86-64 without VNNI, ORT's U8S8 kernels multiply with VPMADDUBSW, which adds two
u8*s8 products into a *saturating* int16: 255*127*2 = 64770 > 32767, so full-range
weights can clip (ORT's quantization docs: "reduce_range ... non-VNNI machine").
VNNI (AVX512-VNNI or AVX-VNNI) accumulates straight into int32, and arm64 kernels
(UDOT/SDOT or widening NEON) do not saturate either. Measured on an AMD EPYC with
AVX2 only: a full-range int8 draft fell to top-1 0.375 of its own reference fused,
0.875 with QDQ fusion off (tests/test_convert_onnx_static.py).

This module only reads CPU facts; it knows nothing about models.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Int8Path:
    """The CPU's int8 matmul path as ORT's CPU provider sees it."""

    arch: str  # "x86-64", "arm64" or the machine name
    vnni: bool  # int32 accumulation of u8*s8 products (x86 VNNI; arm64 dot products)
    saturates_u8s8: bool  # full-range U8S8 can clip in a 16-bit intermediate

    @property
    def one_row_kernel(self) -> bool:
        """Whether MatMulNBits at int8 activations (accuracy level 4) sums a one-row product in
        another order than a product of several rows: ORT's AVX2 int8 path has a kernel of its
        own for M = 1 with symmetric weights (MLAS sqnbitgemm_m1_sym_kernel_avx2_int8_*), ~1e-6
        from the multi-row kernel's sums, while every M >= 2 gives a row the same bits at any
        position and thread count (measured on an AMD EPYC with AVX2 only, ORT 1.32). VNNI
        machines (the earlier CI's) and arm64 keep their path: nothing pads for them."""
        return self.arch == "x86-64" and not self.vnni

    @property
    def name(self) -> str:
        """A label for reports, e.g. 'x86-64 avx2 (no VNNI)'."""
        if self.arch != "x86-64":
            return self.arch
        return "x86-64 " + ("with VNNI" if self.vnni else "avx2 (no VNNI)")


def int8_path_from_flags(machine: str, flags: set[str]) -> Int8Path:
    """Classify a CPU from its machine name and (lower-case) feature flags."""
    m = machine.lower()
    if m in ("x86_64", "amd64", "x86-64"):
        vnni = bool({"avx512_vnni", "avx_vnni", "avx512vnni", "avxvnni"} & flags)
        return Int8Path("x86-64", vnni, saturates_u8s8=not vnni)
    if m in ("arm64", "aarch64"):
        return Int8Path("arm64", True, saturates_u8s8=False)
    return Int8Path(m, False, saturates_u8s8=False)


def _cpu_flags() -> set[str]:
    try:  # Linux
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:  # macOS on Intel
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.leaf7_features", "machdep.cpu.features"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout
        return {f.lower().replace(".", "_") for f in out.split()}
    except (OSError, subprocess.SubprocessError):
        return set()


@cache
def int8_path() -> Int8Path:
    """This machine's int8 path (cached)."""
    return int8_path_from_flags(platform.machine(), _cpu_flags())
