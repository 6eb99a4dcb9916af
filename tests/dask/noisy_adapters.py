"""``testvals`` files read by an adapter that logs a warning through dask's logger.

Its warning stands for what dask's own loggers print inside a worker process (a task
cancelled at shutdown, a worker pausing): the command line keeps it off stderr unless
``--debug``.
"""

import logging

from dask_adapters import ValuesAdapter

WARNING = "simstore-test: a warning from inside a dask worker"


class NoisyValuesAdapter(ValuesAdapter):
    name = "noisyvals"

    def iter_samples(self, path, key, options):
        logging.getLogger("distributed.worker").warning(WARNING)
        yield from super().iter_samples(path, key, options)
