"""`mlxasr app`'s last step: say where the page is and open it in the default browser (webbrowser)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

__all__ = ["open_page"]


def _has_display() -> bool:
    # Without a display (a Linux console, ssh), webbrowser would fall back to a text browser that takes
    # over the terminal the server logs to. $BROWSER, when set, is what the user asked for.
    if sys.platform == "darwin" or sys.platform == "win32" or os.environ.get("BROWSER"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def open_page(url: str, browser: bool, warning: Callable[[str], None]) -> None:
    """Print the page's address on stdout and, with `browser`, open it; the browser connects once the
    server runs (its socket is listening already). Opening runs on its own thread: a browser command
    that waits for its window never holds the server up."""
    print(f"the page: {url}", flush=True)
    if not browser:
        return
    if not _has_display():
        warning(f"no display to open a browser on: open {url} yourself")
        return

    def browse() -> None:
        import webbrowser

        try:
            opened = webbrowser.open(url)
        except Exception:  # a broken browser setting must not stop the server
            opened = False
        if not opened:
            warning(f"no browser could be opened: open {url} yourself")

    threading.Thread(target=browse, name="mlxasr-browser", daemon=True).start()
