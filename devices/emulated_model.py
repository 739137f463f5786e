"""A CausalLM whose every pass is padded to what a device profile predicts.

Emulation is applied from outside, by wrapping a loaded model: strategies and
the scheduler call the wrapper exactly as they call the model, so the real
threads and channel run at the emulated device's proportions. Timings taken
through it are emulated and must be labelled so (`emu.label`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EmulateInProcess:
    """Picklable: the Mirror-SD draft process (runtime/mirror/draft_process.py) calls it on the
    draft it loaded, so its stages are padded to the same profile as in this process. The
    runtime only calls what it is given (STYLE 11); the emulation is built up here."""

    spec: str  # --emulate PROFILE[:TARGET[+DRAFT]]
    target_cfg: Any  # the real target's config (the sizes a spec omits come from the configs)

    def __call__(self, draft) -> EmulatedModel:
        from devices.emulation import Emulator

        emu = Emulator.from_spec(self.spec, self.target_cfg, draft.config)
        return EmulatedModel(draft, emu, "draft")


class EmulatedModel:
    """Delegates to `model`; each forward, layer range or head runs inside
    `emu.stage(role, ...)`."""

    def __init__(self, model, emu, role: str, respawn: EmulateInProcess | None = None):
        self.model, self.emu, self.role = model, emu, role
        self.config = model.config
        # ",real-vocab": logits padded to the emulated vocabulary with -inf (tokens never drawn)
        self.pad_to = (
            emu.logits_vocab if (emu.logits_vocab or 0) > model.config.vocab_size else None
        )
        if self.pad_to is not None:
            from dataclasses import replace

            self.config = replace(model.config, vocab_size=self.pad_to)
        self.backend = f"{model.backend}+emulated"
        self.supports_layer_range = model.supports_layer_range
        # an SS draft stays one (runtime/decoding/ss_draft.is_ss_draft): its windows and
        # branch waves then run their multi-stream passes, padded by forward_streams
        self.ss_streams = getattr(model, "ss_streams", 0)
        spec = getattr(model, "load_spec", None)
        if role == "target" and spec is not None:
            # the checkpoint's stored extras (mirror's tuned exit head) are found through it; a
            # draft's is not passed on: a draft process would load that draft un-emulated
            self.load_spec = spec
        if respawn is not None and spec is not None:
            # --draft-process: (path, backend, kw, wrap): the child loads, then re-emulates
            self.process_spec = (*spec, respawn)

    def forward_streams(self, tokens, cache, *, first=None, positions=None, mask=None):
        """A speculative-streaming draft's multi-stream pass (runtime/drafts/ss/torch.py):
        its main tokens plus n stream tokens on each main position from `first` on."""
        B, T = np.asarray(tokens).reshape(-1, np.shape(tokens)[-1]).shape
        owners = T - (T - 1 if first is None else first)
        n = T + owners * self.ss_streams
        with self.emu.stage(self.role, n_tokens=n, context=cache.offset, batch=B):
            out = self.model.forward_streams(
                self._fold(tokens), cache, first=first, positions=positions, mask=mask
            )
            return self._pad(out)

    def _fold(self, tokens):
        """Token ids past the real vocabulary (only a probe's random windows draw them: the
        padded logits give them no mass) are folded into it."""
        if self.pad_to is None or not np.issubdtype(np.asarray(tokens).dtype, np.integer):
            return tokens
        return np.asarray(tokens) % self.model.config.vocab_size

    def _pad(self, logits):
        if self.pad_to is None:
            return logits
        x = np.asarray(logits)
        out = np.full((*x.shape[:-1], self.pad_to), -np.inf, dtype=x.dtype)
        out[..., : x.shape[-1]] = x
        return out

    def new_cache(self, batch: int = 1):
        return self.model.new_cache(batch)

    def export_records(self) -> list:
        """In a draft process: the stage records since the last call, to send home."""
        return self.emu.take_records()

    def import_records(self, recs: list) -> None:
        """In the target's process: the records the draft process's copy of this model sent."""
        self.emu.add_records(recs)

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        B, T = np.asarray(tokens).reshape(-1, np.shape(tokens)[-1]).shape
        with self.emu.stage(self.role, n_tokens=T, context=cache.offset, batch=B):
            return self._pad(
                self.model.forward(self._fold(tokens), cache, positions=positions, mask=mask)
            )

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        B, T = np.shape(x)[:2]
        ctx = cache.layer_offset(start) if hasattr(cache, "layer_offset") else cache.offset
        with self.emu.stage(
            self.role, n_tokens=T, layers=(start, stop), head=False, context=ctx, batch=B
        ):
            x = self._fold(x) if start == 0 else x  # ids at layer 0, hidden states after
            return self.model.forward_layers(x, cache, start, stop, positions=positions, mask=mask)

    def head(self, hidden) -> np.ndarray:
        B, T = np.shape(hidden)[:2]
        n = self.config.num_layers
        with self.emu.stage(self.role, n_tokens=T, layers=(n, n), head=True, batch=B):
            return self._pad(self.model.head(hidden))


def emulate_draft(like: EmulatedModel, draft) -> EmulatedModel:
    """Another real draft emulated as `like` (the pair's emulated draft) is: `apps.bench --drafts`
    under --emulate, so no draft of an emulated run goes unpadded."""
    emu = like.emu.for_draft(draft.config)
    respawn = EmulateInProcess(emu.spec, emu.target_cfg)
    return EmulatedModel(draft, emu, "draft", respawn)


def emulate_pair(spec: str, target, draft):
    """Wrap a loaded pair for `--emulate SPEC`; returns (emulator, target, draft)."""
    from devices.emulation import Emulator

    emu = Emulator.from_spec(spec, target.config, draft.config if draft is not None else None)
    respawn = EmulateInProcess(spec, target.config)
    return (
        emu,
        EmulatedModel(target, emu, "target"),
        None if draft is None else EmulatedModel(draft, emu, "draft", respawn),
    )
