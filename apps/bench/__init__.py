"""`python -m apps.bench`: Duet against target-alone and the speculative decoders users run today.

The comparison (`python -m apps.bench [flags]`):
__main__.py       the parser, the subcommand table and the printout
args.py           what --methods, --temps and --gammas mean as checked lists
compare.py        the run in stages: flags -> prompts and pair -> runners -> records -> rows
sweep.py          the runners of the methods, once per γ of --gammas
drafts.py         --drafts: the same methods with other drafts beside the pair's own
prompt_set.py     the prompt set (Spec-Bench question JSONL) and each turn's prompt ids
schedule.py       warm-up, then runners alternated round-robin per prompt, in one process
report.py         per method/temperature summary: table and JSON
categories.py     per-category rows, as Spec-Bench's speed.py prints them
specbench.py      per-prompt records in Spec-Bench's answer format
hybrid_pair.py    where the hybrid (Qwen3.5) pair lives, and the command that builds it
bootstrap.py      the paired percentile bootstrap behind every 95 % interval
runners/          what it times: Duet's methods (duet.py) and every peer (runners/__init__.py)

Subcommands (`python -m apps.bench NAME`, the table in __main__.py):
edge.py           `edge`: FlexSpec edge-cloud baselines over emulated links (edge_run.py: one
                  run; edge_codecs.py: `--codecs`, the uplink codecs through a real verifier)
footprint.py      `footprint`: Duet's ar against HF generate, a fresh process each: tok/s, RSS
evolving.py       `evolving`: FlexSpec Table II, generic vs anchor draft on evolved targets
                  (evolving_setup.py: the base, its evolved targets and prompts;
                  evolving_rows.py: each draft's acceptance per target; evolving_e2e.py: its
                  end-to-end ms/token over an emulated link)

Studies (`python -m apps.bench.studies.NAME`, one measurement each): studies/__init__.py.
"""
