"""Progress bars for long calls: tqdm where it is installed (a widget in a notebook), else
one redrawn line on a terminal, else nothing."""

from __future__ import annotations

import sys
import time
from typing import Optional


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


class Bar:
    """A progress bar over ``total`` items (``None``: unknown), shown only when ``enabled``
    and there is somewhere to show it."""

    def __init__(self, total: Optional[int], unit: str, enabled: bool, label: str) -> None:
        self._tqdm = None
        self._line = False
        self._total = total
        self._unit = unit
        self._label = label
        self._position = 0
        self._started = time.monotonic()
        self._drawn = 0.0
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm  # noqa: PLC0415 (optional)

            self._tqdm = tqdm(total=total, unit=f" {unit}", desc=label, dynamic_ncols=True)
        except ImportError:
            self._line = sys.stderr.isatty() and not _in_notebook()

    def set(self, position: int, total: Optional[int] = None, note: str = "") -> None:
        """Moves the bar to ``position`` (of ``total``, when it became known)."""
        if total is not None:
            self._total = total
        if self._tqdm is not None:
            if total is not None and self._tqdm.total != total:
                self._tqdm.total = total
            self._tqdm.update(position - self._position)
            if note:
                self._tqdm.set_postfix_str(note, refresh=False)
        elif self._line and time.monotonic() - self._drawn > 0.1:
            self._drawn = time.monotonic()
            rate = position / max(time.monotonic() - self._started, 1e-9)
            of = f"/{self._total}" if self._total is not None else ""
            sys.stderr.write(
                f"\r{self._label}: {position}{of} {self._unit} ({rate:.1f}/s) {note}   "
            )
            sys.stderr.flush()
        self._position = position

    def add(self, count: int) -> None:
        """Moves the bar ``count`` items on."""
        self.set(self._position + count)

    def close(self) -> None:
        """Ends the bar (its line stays on a terminal)."""
        if self._tqdm is not None:
            self._tqdm.close()
        elif self._line:
            self._drawn = 0.0
            self.set(self._position)
            sys.stderr.write("\n")
