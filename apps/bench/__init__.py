"""`python -m apps.bench`: Duet against target-alone and the speculative decoders users run today.

prompts.py        the prompt set (Spec-Bench question JSONL) and each turn's prompt ids
runner.py         what every runner returns for one turn (TurnResult)
duet_runner.py    Duet's methods (`ar`, `sd`, and any later one in runtime.decoding.METHODS)
mlx_lm_runner.py  mlx-lm's `speculative_generate_step` on the same pair and γ
hf_runner.py      Hugging Face assisted generation (`assistant_model=`) at a fixed γ
schedule.py       warm-up, then methods alternated round-robin per prompt, in one process
report.py         per method/temperature summary: table and JSON
specbench.py      per-prompt records in Spec-Bench's answer format
evolving.py       `apps.bench evolving`: FlexSpec Table II, generic vs anchor draft on evolved targets
"""
