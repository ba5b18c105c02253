"""`marin browse`: a read-only web browser for an output tree, in one process.

    server = start_server("/path/to/prefix", port=0).start_in_thread()
    print(server.url)   # http://127.0.0.1:<port>/
    server.shutdown()

Pages (see `pages` for the URL scheme): experiments, an experiment's DAG and steps, a
step's info / config / version inputs / history / lease / log / files, a paged file
viewer (JSON lines, gzip / zstd, parquet, JSON, text), the same documents side by side
across consecutive steps, and training curves with eval results.

Why this stack -- the Python standard library's `ThreadingHTTPServer`, HTML rendered on
the server (every value through `html.escape`), inline CSS, pictures drawn on the server
as inline SVG, and no JavaScript:

- one command and nothing to build: Marin's browser is Flask + a React app started as
  two processes from its own folder, with an npm build. Here `marin browse` is the whole
  thing, installed with the package, with no new dependency (and so nothing extra to
  audit or pin);
- the data lives behind the executor's `Store` (local, `s3://`, `gs://`), which only the
  server can read; a client-side app would only add an API layer between the two;
- a small attack surface for a server that reads a whole storage prefix: two methods
  (GET, HEAD), every path checked in one place (`safety`), a Content-Security-Policy
  that allows no script at all, and loopback-only by default;
- the pictures are small: a DAG of a thousand boxes or a loss curve of a few thousand
  points is a few hundred KB of SVG, drawn in one pass, with links that work without
  scripts (a DAG node is an `<a>`).

Pages are rendered per request from what the tree holds now (no cache, so nothing is
stale while a run writes); within a request each step's bookkeeping is read once, and
files are read one page at a time.
"""

from .server import BrowserServer, start_server

__all__ = ["BrowserServer", "start_server"]
