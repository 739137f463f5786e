"""A fitted head's step in ONNX Runtime: what `--draft head` runs beside a CPU target.

A head step in PyTorch is ~30 small ops (fuse, norms, fc, one decoder layer, the LM head over
the kept ids): on this 2-core CPU their dispatch costs more than their arithmetic. The same
step as ONNX graphs (converters/onnx_eagle.py: `step.taps` reads the target's taps,
`step.chain` the head's own output) runs in one call, int8 weights by default, as the MTP
head's does (runtime/drafts/mtp/onnx.py). Exported once into the head's sidecar folder and
again when its weights are newer. The graphs' logits cover the kept ids; they are scattered
into full-vocabulary rows, -inf elsewhere, as TorchEagleStep returns them (so the draft's q is
exactly the softmax over the kept ids). Same interface as mtp.torch.TorchMTPStep, numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.drafts.mtp.onnx import QUANTS, OnnxMTPStep
from runtime.errors import DuetError
from runtime.paths import is_stale

KINDS = ("taps", "chain")  # the target's taps in, or the head's own previous output


def step_files(folder: Path, quant: str) -> dict[str, Path]:
    """{kind: path} of the step graphs in the head's sidecar `folder` (`quant` fp32 or int8)."""
    tag = "" if quant == "fp32" else f".{quant}"
    return {k: Path(folder) / f"step.{k}{tag}.onnx" for k in KINDS}


class OnnxEagleStep(OnnxMTPStep):
    """The head's two step graphs (taps, chain) in ONNX Runtime sessions (CPU)."""

    def __init__(self, paths: dict, cfg, vocab_ids: np.ndarray, threads: int = 1):
        super().__init__(paths["taps"], cfg, threads)
        self.chain = self.open(paths["chain"], threads)  # self.session reads the taps
        self.ids = np.asarray(vocab_ids, np.int64)

    @classmethod
    def for_target(cls, target, head, weights: Path, threads: int = 1, quant: str = "int8"):
        """The step graphs of `head` (its sidecar's `weights` file), exported beside it on
        first use and again when the weights are newer; `target`: the PyTorch twin."""
        from runtime.backends.exporters import export

        if quant not in QUANTS:
            raise DuetError(f"head step weights {quant!r}: choose from {', '.join(QUANTS)}")
        folder = Path(weights).parent
        want = step_files(folder, quant)
        if any(is_stale(p, [weights]) for p in want.values()):
            try:
                export("onnx-eagle", target.module, head, folder, quant, source=folder)
            except OSError as e:
                raise DuetError(
                    f"{folder}: cannot write the head's ONNX step ({e}); use --draft-backend torch"
                ) from None
        return cls(want, target.config, head.vocab_ids.numpy(), threads)

    def __call__(self, ids: list[int], hidden: np.ndarray, j: int, past):
        """Entries j.. for tokens `ids` reading `hidden` (n, n_taps*H or H)."""
        session = self.chain if hidden.shape[-1] == self.cfg.hidden_size else self.session
        small, out, k, v = session.run(None, self.feed(ids, hidden, j, past))
        full = np.full((len(ids), self.cfg.vocab_size), -np.inf, np.float32)
        full[:, self.ids] = small[0]
        return list(out[0]), list(full), (k, v)
