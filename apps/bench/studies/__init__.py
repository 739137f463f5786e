"""Studies: one measurement each, run on its own as `python -m apps.bench.studies.NAME`.

Each answers one question behind a figure or a design choice; none is part of the comparison
command (`python -m apps.bench`) or its subcommands.

contention.py        do this machine's cores compute in parallel (what Mirror-SD can gain)
copy_bound.py        the fastest any model-free draft could make a target's turns (an oracle)
edge_keep.py         how much of the T = 0 edge speedup T = 1 keeps (reads two edge runs)
enumerative_speed.py ms per row of SQS's integer coding, the fast path against the plain one
hybrid_rollback.py   what landing a hybrid (Qwen3.5) model's states costs, replay vs redecode
server_overhead.py   what serving over HTTP costs against runtime.generate's loop
ss_draft_speed.py    a speculative-streaming draft's drafting time and passes against AR drafting
ss_e2e.py            sd and mirror with an AR draft and with an SS draft, end to end
uplink_codecs.py     what the compressed uplink codecs cost in bits and keep in acceptance
"""
