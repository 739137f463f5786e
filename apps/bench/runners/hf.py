"""Hugging Face assisted generation (`generate(..., assistant_model=draft)`) at a fixed γ.

The assistant's generation config is pinned to a fair fixed-window comparison:
`num_assistant_tokens=γ`, `num_assistant_tokens_schedule="constant"` and
`assistant_confidence_threshold=0` (no early stop of the draft). At
temperature > 0 transformers uses speculative sampling (lossless); top-k is
switched off so the law is the target's. Accepted length is measured: the
streamer receives each verification pass's committed tokens in one `put`, so
there is one put per target forward (the first put is the prompt). On a stateful model
(hybrid Qwen3.5) transformers refuses assisted generation with a ValueError; that text is
the turn's result (runner.refused).
"""

from __future__ import annotations

import time

from .turn import TurnResult, refused


class _StepLengths:
    """A transformers streamer recording how many tokens each target pass committed."""

    def __init__(self):
        self.lengths: list[int] = []
        self.seen_prompt = False

    def put(self, value):
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.lengths.append(int(value.numel()))

    def end(self):
        pass


class HfAssistedRunner:
    """`hf-assisted`: generate with the pair's draft as assistant; `hf` (alone=True): the target's
    own `generate`, no draft (Hugging Face's ar, the peer of Duet's ar)."""

    name = "hf-assisted"

    def __init__(self, pair, *, gamma: int, alone: bool = False):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        from runtime.errors import DuetError

        if not alone and (pair.draft_path is None or not pair.draft_path.is_dir()):
            raise DuetError(
                f"HF assisted generation needs a draft directory (got {pair.draft_path}); "
                "`hf` runs the target alone"
            )
        self.torch = torch
        # the assistant's nested generate() warns per call
        transformers.logging.set_verbosity_error()
        load = dict(dtype=torch.float32)
        self.target = AutoModelForCausalLM.from_pretrained(str(pair.target_dir), **load).eval()
        self.draft = None
        if alone:
            self.name = "hf"
        else:
            self.draft = AutoModelForCausalLM.from_pretrained(str(pair.draft_path), **load).eval()
            gc = self.draft.generation_config  # the assistant reads these from its own config
            gc.num_assistant_tokens = gamma
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
        self.gamma = gamma
        self.eos = list(pair.target.config.eos_token_ids)

    def settings(self) -> dict:
        import transformers

        return {
            "torch_threads": self.torch.get_num_threads(),
            "dtype": "float32",
            "gamma": self.gamma if self.draft is not None else None,
            "transformers": transformers.__version__,
        }

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        torch = self.torch
        torch.manual_seed(seed)
        x = torch.tensor([ids], dtype=torch.long)
        streamer = _StepLengths()
        kw = (
            dict(do_sample=True, temperature=temp, top_p=top_p, top_k=0)
            if temp > 0
            else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        )
        t0 = time.perf_counter()
        with torch.inference_mode():
            try:
                y = self._generate(x, max_new, streamer, kw)
            except ValueError as e:  # "assisted generation is not supported with stateful ..."
                return refused(f"transformers: {e}")
        wall = time.perf_counter() - t0
        out = y[0, len(ids) :].tolist()
        if sum(streamer.lengths) != len(out):  # should not happen; do not report a wrong figure
            return TurnResult(out, wall, None, "streamer saw a different token count than output")
        return TurnResult(out, wall, streamer.lengths)

    def _generate(self, x, max_new, streamer, kw):
        torch = self.torch
        if self.draft is not None:
            kw = dict(
                kw,
                assistant_model=self.draft,
                num_assistant_tokens=self.gamma,
                num_assistant_tokens_schedule="constant",
                assistant_confidence_threshold=0.0,
            )
        return self.target.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=max_new,
            min_new_tokens=0,
            eos_token_id=self.eos or None,
            pad_token_id=self.eos[0] if self.eos else 0,
            streamer=streamer,
            **kw,
        )
