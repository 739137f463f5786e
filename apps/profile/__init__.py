"""`python -m apps.profile`: where a Mirror-SD run spends its time, and App. E's fallback sweep.

run.py      a pair through `--method mirror` over a prompt set on one shared Timeline;
            the aggregate summary (mirror_summary over every step of every prompt)
picture.py  the timeline as a self-contained HTML page with an inline SVG (no JS, no CSS files)
report.py   the summary as readable lines (App. E bound, eq. (10) error)
sweep.py    App. E Fig. 7: fallback frequency FF against κ for several exit layers ℓe
chart.py    the sweep's line chart, self-contained HTML/SVG

It measures; it does not tune. Nothing here changes what the runtime commits.
"""
