"""What ``serve`` draws on its terminal: progress bars of long work (weight fetches and model
loads), only when stderr is a TTY; a log or a pipe gets nothing extra::

    nursery.start_soon(show_progress, lambda: progress_items(fetches.snapshot(), services))

:func:`progress_items` (pure) turns the node's fetch board and model services into
:class:`ProgressItem` values; :class:`TerminalProgress` keeps one rich bar per item on a stream,
shown while there is one and gone when there is none, with log lines printed above the bars.
"""

from skulk.console._progress import (
    ProgressItem,
    TerminalProgress,
    progress_items,
    show_progress,
)

__all__ = ["ProgressItem", "TerminalProgress", "progress_items", "show_progress"]
