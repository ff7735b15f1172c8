"""Other libraries' warnings in the run's log instead of the console (``--debug`` keeps them on the console).

Python warnings (a library's deprecation notices) and the log records of ``transformers`` go to
``RUN/warnings.log`` while a run's main process runs; the console keeps distrl's progress and events.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

WARNINGS_LOG = "warnings.log"


class _RunFileHandler(logging.FileHandler):
    """A file handler that makes the run directory if a warning comes before the run's logs do."""

    def _open(self):  # noqa: ANN202 - logging's own signature
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def route_to_run_log(run_dir: Path) -> Callable[[], None]:
    """Send warnings and ``transformers``' records to ``run_dir/warnings.log``; returns what puts them back."""
    handler = _RunFileHandler(Path(run_dir) / WARNINGS_LOG, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.captureWarnings(True)
    captured = logging.getLogger("py.warnings")
    captured.addHandler(handler)
    captured.propagate = False
    library = logging.getLogger("transformers")
    moved = [h for h in library.handlers if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr]
    for stream in moved:
        library.removeHandler(stream)
    library.addHandler(handler)

    def restore() -> None:
        logging.captureWarnings(False)
        captured.removeHandler(handler)
        captured.propagate = True
        library.removeHandler(handler)
        for stream in moved:
            library.addHandler(stream)
        handler.close()

    return restore
