"""The trajectory viewer (``amb serve``): a JSON API over the store and the static pages that use it.

Read side only: every query runs on a read-only DuckDB connection (``replay.web.db``); the pages
are plain HTML, JS and CSS shipped in this package (``static/``), with no CDN and no build step.
``routes`` maps each API path to the module that answers it, ``server`` serves HTTP.
"""
