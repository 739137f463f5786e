"""Emulation: pad each real target/draft stage to what a device profile predicts for a model size.

The real scheduler, threads and token channel run; each stage then sleeps so it
lasts as long as the profile's roofline says that stage would take on that
device for that model size (never shorter than it really took). Both times are
recorded, and everything carries `emu.label`, so output is never mistaken for a
measurement of the device.

API (what runtime.generate, apps.bench and apps.profile call for `--emulate PROFILE[:MODEL]`):

    emu = Emulator.from_spec(spec: str, target_cfg=None, draft_cfg=None) -> Emulator
        spec        "PROFILE" | "PROFILE:TARGET" | "PROFILE:TARGET+DRAFT", each with an optional
                    ",real-vocab": the models' logits are padded to the emulated target's
                    vocabulary (zero-probability tokens), so the per-token host work that
                    grows with V (softmaxes, noise tables, top-k) costs what it would there
                    PROFILE: a shipped profile name (python -m devices list) or a .toml/.json path;
                    TARGET, DRAFT: model-size presets (devices.model_sizes.preset_names(), with an
                    optional "@bits", e.g. qwen3-8b@4). Omitted sizes come from target_cfg /
                    draft_cfg (runtime.config.ModelConfig of the models really loaded), else from
                    the profile's reference models.
        target_cfg, draft_cfg  the real models' configs: their layer counts map the layer
                    ranges the scheduler runs onto the emulated model's layers.

    with emu.stage(role: str, n_tokens: int = 1, *, layers: tuple[int, int] | None = None,
                   head: bool | None = None, context: int = 0, batch: int = 1) as rec:
        ...             # run the real stage here
        role        "target" or "draft"
        n_tokens    positions in this forward (the window: γ + 1 for a verify, 1 per draft step)
        layers      (start, stop) of the REAL model's layers this stage runs; None = all layers
        head        whether the stage applies final norm + LM head (default: layers is None)
        context     cached positions attended to (cache.offset before the call)
        batch       rows in the pass (branch rollouts)
    On normal exit the block sleeps until it has lasted max(predicted, measured);
    `rec` (a StageRecord) then holds measured_s, predicted_s, emulated_s. An
    exception inside the block propagates at once: no padding, no record.

    emu.predict(role, n_tokens=1, *, layers=None, head=None, context=0, batch=1) -> float seconds
    emu.label     -> "emulated:m3-max:qwen3-8b+qwen3-0.6b" (target+draft)
    emu.records   -> list[StageRecord] in completion order (thread-safe appends)
    emu.summary() -> dict: label, profile, models, and per role: count, measured_s,
                     predicted_s, emulated_s, padded_s (sums)

Prediction is the roofline of devices.latency.window_time on the profile's
hardware for the role (memory bandwidth × count, the placement's accelerator
peak; a remote target uses its cloud profile). The link between an edge device
and a cloud target is not emulated here (see devices.links).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from devices.latency import window_time
from devices.model_sizes import ModelSize, model_size
from devices.profile import Profile, load_profile
from runtime.errors import DuetError

ROLES = ("target", "draft")


@dataclass
class StageRecord:
    """One emulated stage: what really happened and what the device would have taken."""

    role: str
    n_tokens: int
    layers: tuple[int, int] | None
    measured_s: float = 0.0  # wall time of the real work inside the block
    predicted_s: float = 0.0  # the profile's prediction for the emulated model
    emulated_s: float = 0.0  # wall time of the block including the padding sleep
    started: float = 0.0  # time.perf_counter() at entry


def _role_size(name: str, cfg, reference, role: str, profile) -> ModelSize:
    """A role's emulated size: the preset `name` when the spec gives one, else the real
    model's config, else the profile's reference model."""
    if name:
        return model_size(name)
    if cfg is not None:
        return ModelSize.from_config(cfg)
    return _size_from_reference(reference, role, profile)


def _size_from_reference(ref: str, role: str, profile: Profile) -> ModelSize:
    try:
        return model_size(ref.split()[0])
    except DuetError:
        raise DuetError(
            f"--emulate {profile.name}: no {role} model size given and the profile's reference "
            f"{role} {ref!r} is not a preset; write {profile.name}:TARGET[+DRAFT]"
        ) from None


REAL_VOCAB = "real-vocab"  # the spec option: logits as wide as the emulated target's vocabulary


def split_spec(spec: str) -> tuple[str, str, list[str]]:
    """ "PROFILE[:TARGET[+DRAFT]][,OPTION...]" -> (PROFILE, "TARGET+DRAFT", options), checked."""
    if not spec or not spec.strip():
        raise DuetError("--emulate needs PROFILE[:MODEL], e.g. m3-max:qwen3-8b")
    body, *opts = [x.strip() for x in spec.strip().split(",")]
    unknown = [o for o in opts if o != REAL_VOCAB]
    if unknown:
        raise DuetError(f"--emulate: unknown option {unknown[0]!r} (known: {REAL_VOCAB})")
    prof_name, _, models = body.partition(":")
    return prof_name, models, opts


class Emulator:
    """Pads stages to a profile's predicted times; see the module docstring for the API."""

    def __init__(
        self,
        profile: Profile,
        target: ModelSize,
        draft: ModelSize,
        *,
        real_target_layers: int | None = None,
        real_draft_layers: int | None = None,
        label: str | None = None,
    ):
        self.profile = profile
        self.models = {"target": target, "draft": draft}
        self.real_layers = {
            "target": real_target_layers or target.num_layers,
            "draft": real_draft_layers or draft.num_layers,
        }
        self.hardware = {role: profile.hardware(role) for role in ROLES}
        self.label = label or f"emulated:{profile.name}:{target.name}+{draft.name}"
        self.records: list[StageRecord] = []
        self.logits_vocab: int | None = None  # from_spec's ",real-vocab"
        self._lock = threading.Lock()
        # the clock and the sleep that pads a stage (tests put a virtual clock here)
        self.clock, self.sleep = time.perf_counter, time.sleep

    @classmethod
    def from_spec(cls, spec: str, target_cfg=None, draft_cfg=None) -> Emulator:
        """Parse "PROFILE[:TARGET[+DRAFT]]" (see the module docstring)."""
        prof_name, models, opts = split_spec(spec)
        profile = load_profile(prof_name)
        t_name, _, d_name = models.partition("+")
        target = _role_size(t_name, target_cfg, profile.reference_target, "target", profile)
        draft = _role_size(d_name, draft_cfg, profile.reference_draft, "draft", profile)
        emu = cls(
            profile,
            target,
            draft,
            real_target_layers=getattr(target_cfg, "num_layers", None),
            real_draft_layers=getattr(draft_cfg, "num_layers", None),
        )
        emu.spec, emu.target_cfg = spec, target_cfg
        # the width of the logits the emulated models return (EmulatedModel); None: the real's
        emu.logits_vocab = target.vocab_size if REAL_VOCAB in opts else None
        if emu.logits_vocab is not None:
            emu.label += f",{REAL_VOCAB}"
        return emu

    def for_draft(self, draft_cfg) -> Emulator:
        """This emulation with another real draft (`apps.bench --drafts`): the same profile and
        target; the draft's size is the spec's DRAFT when it names one, else `draft_cfg`'s.
        Its stage records go to this emulator's list, so one summary counts every draft."""
        other = Emulator.from_spec(self.spec, self.target_cfg, draft_cfg)
        other.records, other._lock = self.records, self._lock
        return other

    def predict(
        self,
        role: str,
        n_tokens: int = 1,
        *,
        layers: tuple[int, int] | None = None,
        head: bool | None = None,
        context: int = 0,
        batch: int = 1,
    ) -> float:
        """Seconds the profile predicts for this stage of the emulated model."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        m, n_real = self.models[role], self.real_layers[role]
        if layers is None:
            span = (0.0, float(m.num_layers))
        else:
            start, stop = layers
            if not 0 <= start <= stop <= n_real:
                raise ValueError(f"layers {layers} out of range for a {n_real}-layer {role}")
            scale = (
                m.num_layers / n_real
            )  # real layer range -> the same share of the emulated model
            span = (start * scale, stop * scale)
        head = (layers is None) if head is None else head
        bw, peak = self.hardware[role]
        return window_time(
            m, n_tokens, bw, peak, context=context, layers=span, head=head, batch=batch
        )

    @contextmanager
    def stage(
        self, role: str, n_tokens: int = 1, *, layers: tuple[int, int] | None = None, **shape
    ) -> Iterator[StageRecord]:
        """Run the block, then sleep until it has lasted what the profile predicts
        (`predict(role, n_tokens, layers=layers, **shape)`: `shape` is its head, context and
        batch)."""
        rec = StageRecord(role, n_tokens, layers)
        rec.predicted_s = self.predict(role, n_tokens, layers=layers, **shape)
        rec.started = t0 = self.clock()
        try:
            yield rec
        finally:
            rec.measured_s = self.clock() - t0
        remaining = rec.predicted_s - (self.clock() - t0)
        if remaining > 0:
            self.sleep(remaining)
        rec.emulated_s = self.clock() - t0
        with self._lock:
            self.records.append(rec)

    def take_records(self) -> list[StageRecord]:
        """The records so far, removed (a draft process sends its draft's home with these)."""
        with self._lock:  # emptied in place: a for_draft sibling shares the list
            recs = list(self.records)
            self.records.clear()
        return recs

    def add_records(self, recs: list[StageRecord]) -> None:
        """Records of stages another process's copy of a model ran (`--draft-process`)."""
        with self._lock:
            self.records.extend(recs)

    def summary(self) -> dict:
        """Totals per role, labelled as emulated."""
        with self._lock:
            recs = list(self.records)
        per_role = {}
        for role in ROLES:
            rs = [r for r in recs if r.role == role]
            per_role[role] = {
                "count": len(rs),
                "measured_s": sum(r.measured_s for r in rs),
                "predicted_s": sum(r.predicted_s for r in rs),
                "emulated_s": sum(r.emulated_s for r in rs),
                "padded_s": sum(max(r.emulated_s - r.measured_s, 0.0) for r in rs),
            }
        return {
            "label": self.label,
            "emulated": True,
            "profile": self.profile.name,
            "models": {role: asdict(m) | {"params": m.params} for role, m in self.models.items()},
            "stages": per_role,
        }
