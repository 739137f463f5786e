"""mlx-lm's speculative decoding (`speculative_generate_step`) on the same pair and γ; for a
target alone (no draft), mlx-lm's own `generate_step`.

The target is the very mlx-lm `Model` Duet's MLX backend runs (loaded by
`mlx_lm.utils.load_model`, same dtype); the draft is loaded the same way from
its checkpoint directory. Accepted length is measured, not assumed: each step
yields its accepted draft tokens with `from_draft=True` and ends with one
target token (`from_draft=False`). mlx-lm accepts a draft token only when it
equals the target's own sample, so at temperature > 0 acceptance collapses.

A hybrid Qwen3.5 pair (which Duet's MLX backend may not run) is loaded with mlx-lm's own
`qwen3_5` class (`model_type` qwen3_5_text read as qwen3_5, the interval of its full-attention
layers from `layer_types`); mlx-lm then refuses to speculate on it with a ValueError (its
`ArraysCache` cannot be trimmed), and that text is the turn's result (runner.refused).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from runtime.errors import DuetError

from .turn import TurnResult, refused


class MlxLmRunner:
    name = "mlx-lm"

    def __init__(self, pair, *, gamma: int):
        import mlx.core as mx

        from runtime.backends import load_model

        alone = pair.draft_path is None  # a target alone: mlx-lm's own generate_step, no draft
        if not alone and not Path(pair.draft_path).is_dir():
            raise DuetError(
                f"mlx-lm needs the draft as a checkpoint directory (got {pair.draft_path})"
            )
        target = pair.target if pair.target.backend == "mlx" else load_model(pair.target_dir, "mlx")
        self.model = target.model
        # mlx_lm.utils.load_model inside
        self.draft = None if alone else load_model(pair.draft_path, "mlx").model
        self.gamma = gamma
        self.eos = set(pair.target.config.eos_token_ids)
        self.mx = mx
        self.gen = importlib.import_module("mlx_lm.generate")  # mlx_lm.generate is also a function

    def settings(self) -> dict:
        return {
            "mlx_device": str(self.mx.default_device()),
            "gamma": self.gamma if self.draft is not None else None,
            "draft": "none: mlx_lm generate_step, the target alone"
            if self.draft is None
            else "mlx",
            "mlx_lm": importlib.import_module("mlx_lm").__version__,
        }

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        from mlx_lm.sample_utils import make_sampler

        mx = self.mx
        mx.random.seed(seed)
        sampler = None if temp == 0 else make_sampler(temp=temp, top_p=top_p if top_p < 1 else 0.0)
        out: list[int] = []
        lengths: list[int] = []
        run = 0  # tokens committed in the current step
        t0 = time.perf_counter()
        prompt = mx.array(ids, dtype=mx.uint32)
        if self.draft is None:  # (token, logprobs) per step: one target token, never a draft's
            steps = (
                (t, lp, False)
                for t, lp in self.gen.generate_step(
                    prompt, self.model, max_tokens=max_new, sampler=sampler
                )
            )
        else:
            steps = self.gen.speculative_generate_step(
                prompt,
                self.model,
                self.draft,
                num_draft_tokens=self.gamma,
                max_tokens=max_new,
                sampler=sampler,
            )
        try:
            for tok, _, from_draft in steps:
                tok = int(tok)
                out.append(tok)
                run += 1
                if not from_draft:  # the target's correction/bonus token closes the step
                    lengths.append(run)
                    run = 0
                if tok in self.eos:
                    break
        except ValueError as e:  # "Speculative decoding requires a trimmable prompt cache"
            if out:
                raise
            return refused(f"mlx-lm: {e}")
        finally:
            steps.close()
        wall = time.perf_counter() - t0
        if run:  # cut by EOS or max_new mid-window
            lengths.append(run)
        return TurnResult(out, wall, lengths)
