"""What the pair probe has measured in this process: two tables, keyed by the models' ids.

`CACHE` holds the stage times, window passes, trial rates, pooled accepted runs and branch
hits; `ALPHA` the acceptance of a short sd run. devices/probe_export.py exports and restores
them (devices/probe_store.py keeps them per pair and machine between processes). Read and
write them as `probe_memo.CACHE`, so that a test can swap in a fresh table.
"""

from __future__ import annotations

CACHE: dict[tuple, object] = {}
ALPHA: dict[tuple, float] = {}
