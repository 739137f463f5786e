"""Device profiles: one TOML (or JSON) file per device, validated on load by the schema below.

A profile says what a device has (accelerators, memory, bandwidth, peak
throughput), where the draft and the target run on it (backend + provider or
compute units), and the latency parameters of the papers' models, every figure
with the source of its number. Shipped profiles live in devices/profiles/;
`python -m devices calibrate` writes new ones (as TOML: devices/profile_toml.py). This
module parses and checks; it predicts nothing (see devices.latency, devices.emulation).

Schema (units are fixed per field; a figure is `{ value, unit, source }`, plus
an optional `r2` for fitted values):

    name = "m3-max"                      # = the file's stem for shipped profiles
    description = "..."
    kind = "edge" | "cloud" | "host"     # host: calibrated on a machine at hand
    count = { value = 8, unit = "devices", source = "..." }   # optional, default 1: devices the
                                         # target is sharded over (the draft runs on one)

    [memory]
    capacity  = { value, unit = "GB",   source }
    bandwidth = { value, unit = "GB/s", source }            # per device

    [accelerators.<id>]                  # at least one
    kind = "cpu" | "gpu" | "npu"
    peak = { value, unit = "TFLOPS" | "TOPS", source }      # or, when no public figure:
    peak_unpublished = "why"

    [draft]  and  [target]
    accelerator = "<id>"                 # one of [accelerators]; "" for a remote target
    backend = "mlx" | "onnx" | "coreml" | "torch" | "remote"
    provider = "..."                     # ONNX EP, Core ML compute units, torch/mlx device,
                                         # or the cloud profile's name for backend = "remote"
    quantize = "int4" | "int8" | "none"  # optional, default "none": the weights' width (the
                                         # ONNX target's MatMulNBits, MLX's 4-bit, ...)

    [latency]
    reference_draft = "qwen3-0.6b"       # what the figures below were measured/derived for
    reference_target = "qwen3-8b@4"
    alpha_edge, beta, delta_cloud, t_base,    # FlexSpec eq. (9)/(10), seconds
    c_layer, c_layer_per_token,               # Mirror-SD c_ℓ(T) ≈ c_layer + T·c_layer_per_token
    t_rv                                      # Mirror-SD T_rv = T_rv(ee) + T_rv(fv), seconds
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from runtime.errors import DuetError

PROFILES_DIR = Path(__file__).parent / "profiles"

KINDS = ("edge", "cloud", "host")
ACCEL_KINDS = ("cpu", "gpu", "npu")
PROVIDERS = {
    "onnx": (
        "cpu",
        "cuda",
        "tensorrt",
        "coreml",
        "qnn",
    ),  # runtime/backends/onnx/llama.py PROVIDERS
    "coreml": ("all", "cpu_only", "cpu_and_gpu", "cpu_and_ne"),  # coremltools ComputeUnit
    "mlx": ("gpu", "cpu"),
    "torch": ("cpu", "cuda", "mps"),
    "remote": (),  # provider = a cloud profile's name
}
QUANTIZE = ("none", "int8", "int4")  # runtime/backends/onnx/target.py's --quantize
LATENCY_FIELDS = (
    "alpha_edge",
    "beta",
    "delta_cloud",
    "t_base",
    "c_layer",
    "c_layer_per_token",
    "t_rv",
)
# optional (calibrated): the target's slowdown while the draft computes beside it, and one
# batched branch pass of the draft (what `--method auto`'s Mirror-SD prediction needs)
OPTIONAL_LATENCY = {"target_slowdown": ("x",), "draft_batch_step": ("s",)}
UNIT_SCALE = {"GB": 1e9, "GB/s": 1e9, "TFLOPS": 1e12, "TOPS": 1e12, "s": 1.0, "devices": 1.0,
              "x": 1.0}  # fmt: skip


class ProfileError(DuetError):
    """A profile file that does not match the schema; the message names the file and field."""


@dataclass(frozen=True)
class Figure:
    """A number with its unit and where it comes from."""

    value: float
    unit: str
    source: str
    r2: float | None = None

    @property
    def si(self) -> float:
        """The value in base units (bytes, bytes/s, ops/s, seconds)."""
        return self.value * UNIT_SCALE[self.unit]


@dataclass(frozen=True)
class Accelerator:
    id: str
    kind: str
    peak: Figure | None  # None when no public figure exists (peak_unpublished says why)
    peak_unpublished: str = ""


@dataclass(frozen=True)
class Placement:
    accelerator: str
    backend: str
    provider: str
    quantize: str = "none"

    @property
    def remote(self) -> bool:
        return self.backend == "remote"


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    kind: str
    count: Figure
    capacity: Figure
    bandwidth: Figure
    accelerators: dict[str, Accelerator]
    draft: Placement
    target: Placement
    latency: dict[str, Figure]
    reference_draft: str
    reference_target: str
    path: Path | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    def sources(self) -> dict[str, str]:
        """Every figure's dotted field name -> its source."""
        out = {
            "count": self.count.source,
            "memory.capacity": self.capacity.source,
            "memory.bandwidth": self.bandwidth.source,
        }
        for a in self.accelerators.values():
            out[f"accelerators.{a.id}.peak"] = (
                a.peak.source if a.peak else f"unpublished: {a.peak_unpublished}"
            )
        out.update({f"latency.{k}": f.source for k, f in self.latency.items()})
        return out

    def hardware(self, role: str) -> tuple[float, float | None]:
        """(bandwidth bytes/s, peak ops/s or None) that runs `role` ("draft" or "target").

        The target is sharded over `count` devices (ideal tensor parallelism:
        bandwidth and peak times count); the draft runs on one. A remote target
        uses its cloud profile's hardware.
        """
        placement = {"draft": self.draft, "target": self.target}[role]
        if placement.remote:
            return load_profile(placement.provider).hardware(role)
        acc = self.accelerators[placement.accelerator]
        n = self.count.value if role == "target" else 1.0
        return self.bandwidth.si * n, (acc.peak.si * n if acc.peak else None)

    def param(self, name: str) -> float:
        """A latency parameter in seconds."""
        return self.latency[name].si


def _err(where: str, fieldname: str, msg: str) -> ProfileError:
    return ProfileError(f"{where}: field '{fieldname}': {msg}")


def _str(d: dict, key: str, where: str, prefix: str = "", choices=None, allow_empty=False) -> str:
    name = prefix + key
    if key not in d:
        raise _err(where, name, "missing")
    v = d[key]
    if not isinstance(v, str) or (not v.strip() and not allow_empty):
        raise _err(where, name, f"expected a non-empty string, got {v!r}")
    if choices is not None and v not in choices:
        raise _err(where, name, f"{v!r} is not one of {', '.join(choices)}")
    return v


def _table(d: dict, key: str, where: str, prefix: str = "") -> dict:
    if key not in d:
        raise _err(where, prefix + key, "missing")
    v = d[key]
    if not isinstance(v, dict):
        raise _err(where, prefix + key, f"expected a table, got {type(v).__name__}")
    return v


def _figure(d: dict, key: str, where: str, units: tuple[str, ...], prefix: str = "") -> Figure:
    name = prefix + key
    f = _table(d, key, where, prefix)
    extra = set(f) - {"value", "unit", "source", "r2"}
    if extra:
        raise _err(
            where, name, f"unknown keys {sorted(extra)}; a figure is {{value, unit, source[, r2]}}"
        )
    if "value" not in f:
        raise _err(where, name, "missing 'value'")
    v = f["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _err(where, name, f"value must be a finite number >= 0, got {v!r}")
    unit = f.get("unit")
    if unit not in units:
        raise _err(where, name, f"unit must be one of {', '.join(units)}, got {unit!r}")
    src = f.get("source")
    if not isinstance(src, str) or len(src.strip()) < 5:
        raise _err(
            where,
            name,
            "every figure needs a 'source' (a URL, a paper table, or 'calibrated on ...')",
        )
    r2 = f.get("r2")
    if r2 is not None and (isinstance(r2, bool) or not isinstance(r2, (int, float))):
        raise _err(where, name, f"r2 must be a number, got {r2!r}")
    return Figure(float(v), unit, src, None if r2 is None else float(r2))


def _placement(d: dict, role: str, where: str, accelerators: dict) -> Placement:
    t = _table(d, role, where)
    backend = _str(t, "backend", where, f"{role}.", choices=tuple(PROVIDERS))
    provider = _str(t, "provider", where, f"{role}.")
    if backend == "remote":
        if role != "target":
            raise _err(where, f"{role}.backend", "only the target may be remote")
        acc = t.get("accelerator", "")
    else:
        if provider not in PROVIDERS[backend]:
            raise _err(
                where,
                f"{role}.provider",
                f"{provider!r} is not a {backend} provider ({', '.join(PROVIDERS[backend])})",
            )
        acc = _str(t, "accelerator", where, f"{role}.")
        if acc not in accelerators:
            raise _err(
                where,
                f"{role}.accelerator",
                f"{acc!r} is not one of [accelerators]: {', '.join(accelerators)}",
            )
    quantize = _str(t, "quantize", where, f"{role}.", QUANTIZE) if "quantize" in t else "none"
    return Placement(acc, backend, provider, quantize)


def parse_profile(data: dict, where: str) -> Profile:
    """Validate a profile's parsed TOML/JSON; raise ProfileError naming `where` and the field."""
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a table at the top level")
    name = _str(data, "name", where)
    description = _str(data, "description", where)
    kind = _str(data, "kind", where, choices=KINDS)
    count = (
        _figure(data, "count", where, ("devices",))
        if "count" in data
        else Figure(1.0, "devices", "a single device")
    )
    mem = _table(data, "memory", where)
    capacity = _figure(mem, "capacity", where, ("GB",), "memory.")
    bandwidth = _figure(mem, "bandwidth", where, ("GB/s",), "memory.")
    if bandwidth.value <= 0:
        raise _err(where, "memory.bandwidth", "must be > 0")
    accs_raw = _table(data, "accelerators", where)
    if not accs_raw:
        raise _err(where, "accelerators", "at least one accelerator is required")
    accelerators = {}
    for aid, a in accs_raw.items():
        pre = f"accelerators.{aid}."
        if not isinstance(a, dict):
            raise _err(where, pre[:-1], "expected a table")
        akind = _str(a, "kind", where, pre, choices=ACCEL_KINDS)
        if "peak" in a:
            peak, why = _figure(a, "peak", where, ("TFLOPS", "TOPS"), pre), ""
        elif "peak_unpublished" in a:
            peak, why = None, _str(a, "peak_unpublished", where, pre)
        else:
            raise _err(
                where, pre + "peak", "missing (give a figure, or 'peak_unpublished' saying why)"
            )
        accelerators[aid] = Accelerator(aid, akind, peak, why)
    draft = _placement(data, "draft", where, accelerators)
    target = _placement(data, "target", where, accelerators)
    lat = _table(data, "latency", where)
    ref_d = _str(lat, "reference_draft", where, "latency.")
    ref_t = _str(lat, "reference_target", where, "latency.")
    latency = {k: _figure(lat, k, where, ("s",), "latency.") for k in LATENCY_FIELDS}
    latency |= {
        k: _figure(lat, k, where, u, "latency.") for k, u in OPTIONAL_LATENCY.items() if k in lat
    }
    unknown = (
        set(lat)
        - set(LATENCY_FIELDS)
        - set(OPTIONAL_LATENCY)
        - {"reference_draft", "reference_target"}
    )
    if unknown:
        raise _err(
            where,
            "latency",
            f"unknown parameters {sorted(unknown)}; expected {', '.join(LATENCY_FIELDS)}",
        )
    return Profile(
        name,
        description,
        kind,
        count,
        capacity,
        bandwidth,
        accelerators,
        draft,
        target,
        latency,
        ref_d,
        ref_t,
        raw=data,
    )


def read_profile_file(path: str | Path) -> Profile:
    """Load and validate one profile file (.toml or .json)."""
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"profile file not found: {p}")
    try:
        if p.suffix == ".json":
            data = json.loads(p.read_text())
        else:
            data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(
            f"{p}: not valid {p.suffix.lstrip('.').upper() or 'TOML'} ({e})"
        ) from None
    prof = parse_profile(data, str(p))
    if p.parent == PROFILES_DIR and prof.name != p.stem:
        raise _err(str(p), "name", f"{prof.name!r} must equal the file name {p.stem!r}")
    return Profile(**{**prof.__dict__, "path": p})


def profile_names() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name ("m3-max"), or any profile file by path."""
    s = str(name_or_path)
    p = Path(s)
    if p.suffix in (".toml", ".json") or p.is_file():
        return read_profile_file(p)
    shipped = PROFILES_DIR / f"{s}.toml"
    if not shipped.is_file():
        raise DuetError(
            f"unknown device profile {s!r}; choose from {', '.join(profile_names())} "
            f"or give a .toml/.json path"
        )
    return read_profile_file(shipped)


def load_all() -> list[Profile]:
    """Every shipped profile, validated (a remote target must name a shipped cloud profile)."""
    profiles = [load_profile(n) for n in profile_names()]
    clouds = {p.name for p in profiles if p.kind == "cloud"}
    for p in profiles:
        if p.target.remote and p.target.provider not in clouds:
            raise _err(
                str(p.path),
                "target.provider",
                f"remote target {p.target.provider!r} is not a "
                f"shipped cloud profile ({', '.join(sorted(clouds))})",
            )
    return profiles
