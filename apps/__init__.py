"""Programs built on the library: server, bench, profile, train, cloud, companion, models.

Importing apps registers converters/' on-the-fly exporters with the engine
(runtime/backends/exporters.py): the programs here pass them down, the engine never imports up.
"""

import converters  # noqa: F401 (registers the on-the-fly exporters)
