"""`python -m apps.train`: train Duet's embedded default target/draft pair.

The pipeline, one module per stage:

    corpus.py     which files, the held-out split, token streams and batches
    tokenizer.py  the shared byte-level BPE tokenizer
    configs.py    the target and draft Qwen3 shapes and their compute ratio
    losses.py     next-token cross-entropy and the distillation loss
    steps.py      the step functions the loop calls (cross-entropy, distillation)
    loop.py       the optimisation loop: schedule, progress, loss log, checkpoints
    resume.py     resume states in OUT/.resume, written whole and read back
    args.py       the loop's flags (add_loop_args), declared once for every subcommand
    plan.py       turning a time budget into step counts from measured speed
    checkpoint.py saving a Hugging Face directory (bf16) and checking it reloads
    evaluate.py   held-out loss and the draft's greedy acceptance; the report
    prompts.py    the held-out prompt set used by evaluation and apps.bench
    pipeline.py   the stages in order: corpus -> tokenizer -> target -> draft -> report

The subcommands (`python -m apps.train NAME`, the table in __main__.py) each have a module:
evolve, anchor, bins, exit_head, mtp, eagle, ss_draft, draft_tune (with draft_eval.py and
layer_draft.py), gather_corpus.

This package trains and evaluates with PyTorch only; it knows nothing about the
runtime's backends or decoding strategies.
"""
