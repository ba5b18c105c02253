"""The browser's pages: routing, reading the tree for one request, rendering HTML.

URL scheme (every `<rel>` is a path relative to the prefix, checked by `safety`):

    /                         experiments (from their manifests)
    /steps                    every step output under the prefix
    /exp/<id>                 an experiment: DAG picture and table of its steps
    /step/<rel>               a step output: info, config, version, history, lease, log, files
    /train/<rel>              a training step: loss / eval curves, eval results
    /file/<rel>?offset=N      a file, one page at a time (or a directory listing)
    /compare/<rel>?offset=N   the documents of one shard across consecutive steps
    /leaderboard?q=P&by=loss  training runs ranked on equal tokens (`marin.leaderboard`)
    /predictions?q=P          pre-registered predictions and their outcomes (`marin.predictions`)
    /raw/<rel>                the file's bytes (streamed, as text/plain or octet-stream)

Each request reads the tree afresh (nothing is cached between requests, so a page is
never stale while a run writes), and within a request each step's bookkeeping is read
once, and the experiment manifests within caps (`_Tree.experiments`, MAX_MANIFESTS: a
note names those left out; `/exp/<id>` reads its own manifest alone). The tree is untrusted input: bookkeeping is parsed as JSON only, through
`OutputTree`'s reads capped at `marin.outputs.MAX_RECORD_BYTES`; no recorded name is
imported or called, and a step whose file was not read says why ("not read").
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import parse_qs

from executor.store import FileInfo, Store, normalize_prefix, open_store
from executor.tree import INFO_FILE, LEASE_FILE, LOG_FILE, STATUS_FILE
from marin import leaderboard, predictions
from marin.outputs import (
    EXPERIMENTS_DIR,
    MAX_RECORD_BYTES,
    PARALLEL_READS,
    Experiment,
    OutputTree,
    StepOutput,
    TreeFileError,
    finite_number,
    human_duration,
    human_size,
    iso_age,
)

from . import files as filepages
from .html import badge, esc, kv, link, num, page, pager, pretty_json, table, url
from .safety import PrefixGuard, Refused, Target, check_name_pattern, check_relpath, decode_path, utf8
from .svg import Node, dag_svg, interval_chart, line_chart, status_colours

FILES_PER_PAGE = 300
DIR_ENTRIES_PER_PAGE = 500
DOCS_PER_PAGE = 20
MAX_DOCS_PER_PAGE = 200
DOC_TEXT_CHARS = 1500
RAW_SOURCE_BYTES = 4000
SMALL_JSON_BYTES = 1 << 20
CHAIN_LIMIT = 12
STREAM_CHUNK = 1 << 16
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRIC_KEYS = ("train/loss", "eval/loss", "optim/learning_rate")
MAX_SERIES = 100
"""`eval/*` metrics a training page draws, the first in metrics.jsonl (besides METRIC_KEYS,
always drawn): one chart each, so a crafted file of 100,000 names cannot make a page of
tens of MB and the server hold a series per name."""
MAX_SERIES_POINTS = 3000
"""Points a series keeps while metrics.jsonl is read; past that it is thinned (svg.thin then
draws at most 1,500)."""
MAX_METRIC_KEY_CHARS = 200
"""A metric name longer than this is left out (and counted)."""
MAX_LEFT_OUT_NAMES = 10_000
"""Names of left-out metrics remembered to count them; past that the page says "at least"."""
MAX_LOOKUP_BYTES = 32 << 20
"""Bookkeeping (steps' records, experiment manifests) that the lookups of related steps of a
compare or training page read at most, also counted in the request's read budget
(`_Tree.count_reads`); past it (plus the record that crosses it, at most 4 MiB) no record is
read and the page says what was not looked at. Manifests are parsed and held: 40 MB of crafted
ones took 200 MB and, looked up once per step of a chain, 8 s of CPU (real ones are ~8 KB)."""
LOOKUP_TIME_SHARE = 0.5
"""The share of the request's `MAX_READ_SECONDS` a compare page's chain lookup may use: the
rest is left for reading the steps' shards."""
MAX_RESULTS_FILES = 20
"""results.json files a training page reads (its step's and those of the steps that read it,
by path); 100 of 1 MiB once made a 164 MB page and took 8 s of CPU and 1 GB."""
MAX_RESULT_ROWS = 200
"""Values shown from one results.json (flattened); the rest are counted, not shown."""
MAX_CELL_CHARS = 300
"""A name or value of a results.json table longer than this is cut."""
MAX_MANIFESTS = 1000
"""Experiment manifests one request reads (every page: `_Tree.experiments`), the most recently
modified first (by the listing's times, which cost no read); the rest are named in a note.
Every page once read every manifest: 200 crafted ones of 4 MiB made one `/` read 838 MB, hold
4 GB and take 16 s of CPU (real manifests hold a few KB)."""
MAX_MANIFEST_BYTES = 32 << 20
"""Bytes of manifests one request reads at most, by the listing's sizes (so one past it is not
opened); also counted in the read budget of the pages that have one (compare, training)."""
MAX_MANIFEST_STEPS = 20_000
"""Step entries of the manifests read that one request looks at, together: the manifest that
crosses it is cut, those after it are not read. 20 manifests of 27,000 entries made `/` look up
1 million step records (46 s of CPU) and a step page list 540,000 readers (a 32 MB page)."""
MAX_UNREAD_NAMED = 20
"""Unread manifests a note names (with links: an experiment's page reads its manifest alone)."""
MAX_EXPERIMENT_STEPS = 2000
"""Steps (table rows, DAG boxes) an experiment's page shows; the rest are counted."""
MAX_STEP_READERS = 500
"""Steps a step page lists as reading it (from the manifests); the rest are counted."""
MAX_DESCRIPTION_CHARS = 1000
"""A manifest's description (and command line) longer than this is cut; other manifest
strings shown on the index are cut at MAX_CELL_CHARS."""


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    stream: Callable[[], Iterator[bytes]] | None = None
    """For large bodies: chunks written one at a time (`body` is then unused)."""

    length: int | None = None


class _Tree(OutputTree):
    """An OutputTree for one request: each step read once, and only under the prefix."""

    def __init__(self, prefix: str, store: Store, guard: PrefixGuard):
        super().__init__(prefix, store)
        self.guard = guard
        self._loaded: dict[str, StepOutput | None] = {}
        self.budget: filepages.ReadBudget | None = None
        self.lookup_seconds: float | None = None
        self.records_read = 0
        self.refused: list[tuple[str, str]] = []
        """(path, why) of each bookkeeping file not read because the lookup limits were reached."""
        self._count_lock = threading.Lock()
        self._readers: _Readers | None = None
        self.manifests_unread: list[FileInfo] = []
        """The manifests `experiments` did not read (the caps), the most recently modified first."""
        self.manifests_stops: list[str] = []
        """The caps `experiments` reached (empty: it read every manifest whole)."""
        self.steps_left_out: dict[str, tuple[int, int]] = {}
        """{manifest path: (its step entries, of which looked at)} of the manifest `experiments` cut."""

    @cached_property
    def experiments(self) -> list[Experiment]:
        """The manifests this request reads, the most recently modified first (by the listing),
        at most MAX_MANIFESTS of them, MAX_MANIFEST_BYTES (by the listed sizes) and
        MAX_MANIFEST_STEPS step entries together; `manifests_unread` and `steps_left_out` say
        what was left out. Sorted like OutputTree's: by created date, newest first."""
        listed = sorted(self.manifest_listing(), key=lambda entry: (-(entry.mtime or 0.0), entry.name))
        chosen: list[FileInfo] = []
        planned = 0
        for entry in listed:
            if len(chosen) >= MAX_MANIFESTS:
                self.manifests_stops.append(f"{MAX_MANIFESTS:,} manifests were read")
                break
            # One larger than a record may be is refused unread on disk, but an object store
            # reads that much to find out: it counts as that much.
            cost = 0 if entry.is_dir else min(entry.size or 0, MAX_RECORD_BYTES + 1)
            if planned + cost > MAX_MANIFEST_BYTES:
                self.manifests_stops.append(f"the next would take them past {_mib(MAX_MANIFEST_BYTES)}")
                break
            planned += cost
            chosen.append(entry)
        loaded: list[Experiment] = []
        looked_at: set[str] = set()  # manifests read (or refused: `problems` says why)
        steps, capped = 0, False
        batch = 1 if self.local else PARALLEL_READS  # (object stores: in parallel, a batch at a time)
        for start in range(0, len(chosen), batch):
            if steps >= MAX_MANIFEST_STEPS:
                capped = True
                break
            entries = chosen[start : start + batch]
            for entry, exp in zip(entries, self._map(self.load_experiment, entries), strict=True):
                if exp is not None and steps >= MAX_MANIFEST_STEPS:
                    capped = True  # read in the batch that reached the cap: left out like the rest
                    continue
                looked_at.add(entry.path)
                if exp is None:
                    continue
                recorded = exp.steps
                if len(recorded) > MAX_MANIFEST_STEPS - steps:
                    capped = True
                    kept = MAX_MANIFEST_STEPS - steps
                    self.steps_left_out[exp.path] = (len(recorded), kept)
                    exp = Experiment(exp.path, {**exp.record, "steps": recorded[:kept]})
                steps += len(exp.steps)
                loaded.append(exp)
        if capped:
            self.manifests_stops.insert(0, f"{MAX_MANIFEST_STEPS:,} steps of them were looked at")
        self.manifests_unread = [entry for entry in listed if entry.path not in looked_at]
        return sorted(loaded, key=lambda exp: exp.created, reverse=True)

    def manifests_left_out(self) -> str | None:
        """What `experiments` left out, in words (None: nothing)."""
        parts = []
        if self.manifests_unread:
            count = len(self.manifests_unread)
            parts.append(f"{count:,} experiment manifest{'s' if count != 1 else ''} not read")
        parts.extend(
            f"{_manifest_id(path)}: {total - kept:,} of its {total:,} steps not looked at"
            for path, (total, kept) in self.steps_left_out.items()
        )
        return "; ".join(parts) or None

    def manifests_cut(self) -> str | None:
        """What `experiments` left out and why (None: nothing)."""
        left_out = self.manifests_left_out()
        if left_out is None:
            return None
        return (
            f"{left_out} (a page reads at most {MAX_MANIFESTS:,} manifests, {_mib(MAX_MANIFEST_BYTES)} "
            f"and {MAX_MANIFEST_STEPS:,} steps of them, the most recently modified first, and stopped "
            f"when {' and '.join(self.manifests_stops)})"
        )

    def count_reads(self, budget: filepages.ReadBudget, seconds: float | None = None) -> None:
        """From now on, the bookkeeping this tree reads counts in `budget` (the request's), at
        most `MAX_LOOKUP_BYTES` of it: past that, once `budget` is spent, or once `seconds` of
        it have passed, a record is not read (TreeFileError, and `refused` says which)."""
        self.budget = budget
        self.lookup_seconds = seconds

    def lookup_spent(self) -> str | None:
        """Why this request's lookups of related steps must stop now; None while they may go on."""
        budget = self.budget
        if budget is None:
            return None
        if self.records_read > MAX_LOOKUP_BYTES:
            return f"the lookup reads at most {MAX_LOOKUP_BYTES >> 20} MiB of steps' records and manifests"
        elapsed = budget.elapsed
        if budget.read > filepages.MAX_READ_BYTES or elapsed > filepages.MAX_READ_SECONDS:
            return _budget_spent()
        if self.lookup_seconds is not None and elapsed > self.lookup_seconds:
            return f"the lookup stops after {self.lookup_seconds:g} s, leaving the rest of the request's time to the files"
        return None

    def read_record(self, path: str, limit: int = MAX_RECORD_BYTES) -> bytes | None:
        if self.budget is None:
            return super().read_record(path, limit)
        why = self.lookup_spent()
        if why is not None:
            with self._count_lock:
                self.refused.append((path, why))
            raise TreeFileError(f"{path}: not read: {why}")
        data = super().read_record(path, limit)
        if data:
            with self._count_lock:
                self.records_read += len(data)
                self.budget.read += len(data)
        return data

    @property
    def readers_cut(self) -> str | None:
        """Why `readers()` did not look at every manifest (None: it did, or was not asked)."""
        return self._readers.cut if self._readers is not None else None

    def readers(self) -> _Readers:
        """Who reads each output, from the experiment manifests: built once per request (a
        compare page asks for each step of its chain), within the lookup limits."""
        if self._readers is not None:
            return self._readers
        users: dict[str, dict[str, str]] = {}
        members: dict[str, list[Experiment]] = {}
        cut = None
        experiments = self.experiments
        manifests = f"{self.abspath(EXPERIMENTS_DIR)}/"
        refused = [why for path, why in self.refused if path.startswith(manifests)]
        if refused:
            cut = (
                f"{len(refused)} experiment manifest{'s' if len(refused) != 1 else ''} not read: {refused[0]}"
            )
        capped = self.manifests_cut()
        if capped is not None:
            cut = f"{cut}; {capped}" if cut else capped
        for exp in experiments:
            for number, entry in enumerate(exp.steps):
                if number % 1024 == 0 and (why := self.lookup_spent()) is not None:
                    cut = cut or f"the experiment manifests were read only in part: {why}"
                    break
                output = exp.output_path(entry, self.prefix) or ""
                members.setdefault(output, []).append(exp)
                name = _str(entry.get("name"))
                for dep in _entry_deps(entry, exp, self.prefix):
                    users.setdefault(dep, {}).setdefault(output, name)
            else:
                continue
            break
        self._readers = _Readers(users, members, cut)
        return self._readers

    def load_step(self, path: Any) -> StepOutput | None:
        if not isinstance(path, str):  # a recorded path of the wrong JSON type names nothing
            return None
        if path in self._loaded:
            return self._loaded[path]
        step = None
        target = self.guard.resolve_recorded(path)
        if target is not None and self._bookkeeping_inside(target):
            step = super().load_step(target.path)
        self._loaded[path] = step
        return step

    def _bookkeeping_inside(self, target: Target) -> bool:
        """A symlinked `.executor_info` pointing out of the prefix is not read."""
        if target.local is None:
            return True
        try:
            for name in (INFO_FILE, STATUS_FILE):
                self.guard.resolve(f"{target.relpath}/{name}")
        except Refused as refused:
            # Only a link out (403) hides the step; a link loop is left to the read, and the
            # step then says why its file was not read.
            return refused.status != 403
        return True


@dataclass
class _Readers:
    """Who reads what, from the experiment manifests (`_Tree.readers`)."""

    users: dict[str, dict[str, str]]
    """{output path: {the output path of a step that reads it: that step's name}}."""

    members: dict[str, list[Experiment]]
    """{output path: the experiments that include it (once per entry)}."""

    cut: str | None
    """Why not every manifest was looked at (the lookup limits), else None."""


def _int(params: dict[str, list[str]], key: str, default: int, high: int = 1 << 62) -> int:
    values = params.get(key)
    if not values:
        return default
    try:
        return max(0, min(high, int(values[0])))
    except ValueError:
        raise Refused(400, f"bad {key}: {values[0]!r}") from None


class App:
    """Answers GET requests for one prefix (the HTTP layer is in `server`)."""

    def __init__(self, prefix: str, store: Store | None = None):
        self.prefix = normalize_prefix(prefix)
        self.store = store or open_store(self.prefix)
        self._request = threading.local()
        self.routes: dict[str, Callable[..., Response]] = {
            "": self.index,
            "steps": self.all_steps,
            "exp": self.experiment,
            "step": self.step,
            "train": self.training,
            "file": self.file,
            "compare": self.compare,
            "raw": self.raw,
            "leaderboard": self.leaderboard,
            "predictions": self.predictions,
        }

    # -- dispatch -------------------------------------------------------------
    def handle(self, target: str) -> Response:
        try:
            raw_path, _, query = target.partition("?")
            segments = decode_path(raw_path)
            try:
                params = parse_qs(query, max_num_fields=20, errors="strict")
            except (ValueError, UnicodeDecodeError) as error:
                raise Refused(400, "bad query string") from error
            route, rest = segments[0], "/".join(segments[1:])
            handler = self.routes.get(route)
            if handler is None or (route in ("", "steps") and rest):
                raise Refused(404, "not found")
            self._request.guard = PrefixGuard(self.prefix, self.store)
            tree = _Tree(self.prefix, self.store, self.guard)
            return handler(tree, rest, params)
        except Refused as refused:
            return self.error(refused.status, refused.message)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return self.error(404, "not found")
        except Exception as error:  # a bad file in the tree must not take the server down
            traceback.print_exc()
            return self.error(500, f"{type(error).__name__}: {error}")

    @property
    def guard(self) -> PrefixGuard:
        """This request's guard (one per request: it caches what it resolved)."""
        return self._request.guard

    def html(self, title: str, body: str, status: int = 200) -> Response:
        # `esc` spells lone surrogates as escapes; backslashreplace is the net for any it missed.
        return Response(status, page(title, body, self.prefix).encode("utf-8", "backslashreplace"))

    def error(self, status: int, message: str) -> Response:
        titles = {400: "Bad request", 403: "Forbidden", 404: "Not found", 405: "Method not allowed"}
        title = titles.get(status, "Error")
        return self.html(title, f"<h1>{esc(status)} {esc(title)}</h1><p>{esc(message)}</p>", status)

    def rel(self, path: str) -> str | None:
        """The relative path of a recorded full path, if it lies under the prefix."""
        target = self.guard.resolve_recorded(path) if path else None
        return target.relpath if target else None

    def step_link(self, path: str, text: str | None = None) -> str:
        relpath = self.rel(path)
        if relpath is None:
            return f'<span class="mono">{esc(text or path)}</span> <span class="muted">(outside the prefix)</span>'
        return _path_link("step", relpath, text)

    def manifests_html(self, tree: _Tree, consequence: str = "") -> str:
        """A note saying which manifests this request left out (`_Tree.experiments`), naming
        the most recent unread ones; empty when it read them all (or none were asked for)."""
        if "experiments" not in tree.__dict__:
            return ""
        left_out = tree.manifests_left_out()
        if left_out is None:
            return ""
        unread = tree.manifests_unread
        named = [_path_link("exp", _manifest_id(entry.path)) for entry in unread[:MAX_UNREAD_NAMED]]
        names = (
            "<p>Not read, the most recently modified first: "
            + ", ".join(named)
            + (f" and {len(unread) - len(named):,} more" if len(unread) > len(named) else "")
            + " (an experiment's page reads its manifest alone).</p>"
            if named
            else ""
        )
        return (
            f'<div class="note manifests-unread"><p><b>{esc(left_out)}</b>: a page reads at most '
            f"{MAX_MANIFESTS:,} experiment manifests, {_mib(MAX_MANIFEST_BYTES)} and "
            f"{MAX_MANIFEST_STEPS:,} steps of them, the most recently modified first, and stopped when "
            f"{esc(' and '.join(tree.manifests_stops))}.{' ' + esc(consequence) if consequence else ''}</p>"
            f"{names}</div>"
        )

    # -- experiments ----------------------------------------------------------
    def index(self, tree: _Tree, _rest: str, _params: dict) -> Response:
        rows = []
        for exp in tree.experiments:
            counts = Counter(
                step.status if step else "MISSING" for _entry, step in tree.experiment_steps(exp)
            )
            total, _kept = tree.steps_left_out.get(exp.path, (len(exp.steps), 0))
            git = exp.git
            commit = _str(git.get("commit"))[:10] + (" (dirty)" if git.get("dirty") else "")
            by = f"{exp.record.get('user') or ''}@{exp.record.get('host') or ''}".strip("@")
            statuses = " ".join(f"{badge(status)} {count}" for status, count in sorted(counts.items()))
            if total > len(exp.steps):
                statuses += f" <span class=muted>{total - len(exp.steps):,} not looked at</span>"
            rows.append(
                [
                    _path_link("exp", exp.id),
                    f"{esc(_cut(exp.created, MAX_CELL_CHARS))}<br><span class=muted>{esc(iso_age(exp.created))}</span>",
                    num(f"{total:,}"),
                    statuses,
                    f'<span class="mono">{esc(commit)}</span>',
                    esc(_cut(by, MAX_CELL_CHARS)),
                    esc(_cut(str(exp.record.get("description") or ""), MAX_DESCRIPTION_CHARS)),
                ]
            )
        body = "<h1>Experiments</h1>" + self.manifests_html(tree)
        if rows:
            body += table(
                ["experiment", "created", "steps", "status", "git commit", "by", "description"], rows
            )
        else:
            body += f'<p class="muted">no experiment manifests under {esc(self.prefix)}/experiments.</p>'
        body += f"<p>{link('/steps', 'All step outputs under the prefix')}</p>"
        return self.html("Experiments", body)

    def leaderboard(self, tree: _Tree, rest: str, params: dict) -> Response:
        if rest:
            raise Refused(404, "no such page")
        pattern = (params.get("q") or [""])[0].strip() or None
        if pattern:
            check_name_pattern(pattern)
        by = (params.get("by") or ["loss"])[0]
        if by not in leaderboard.METRICS:
            raise Refused(400, f"bad by: {by!r} (one of {', '.join(leaderboard.METRICS)})")
        try:
            runs = leaderboard.training_runs(tree, pattern)
        except ValueError as error:
            raise Refused(400, str(error)) from None
        # Saying what differs compares every recorded field of every run of a group: bounded.
        wide = len(leaderboard.compared_fields_cut(runs))
        groups = leaderboard.rank(runs, by)
        other = "bpb" if by == "loss" else "loss"
        body = (
            "<h1>Leaderboard</h1>"
            + self.manifests_html(tree, _UNLISTED_OUTPUTS)
            + f'<form method="get" action="/leaderboard"><input name="q" value="{esc(pattern or "")}" '
            'placeholder="experiment or step-name pattern"> '
            f'<input type="hidden" name="by" value="{esc(by)}"><button>filter</button> '
            f"ranked by final <b>eval/{esc(by)}</b> (lower is better) among runs on equal tokens; "
            f"{link(url('leaderboard', q=pattern, by=other), f'rank by eval/{other}')}</form>"
        )
        if wide:
            body += (
                f'<p class="muted note left-out">{wide} run{"s" if wide != 1 else ""} record more than '
                f"{leaderboard.MAX_COMPARED_FIELDS:,} config fields: what differs is compared over the "
                f"first {leaderboard.MAX_COMPARED_FIELDS:,} of each (by name)</p>"
            )
        if not groups:
            body += '<p class="muted">no finished training runs' + (
                f" matching {esc(pattern)}</p>" if pattern else "</p>"
            )
        for group in groups:
            tokens = f"{group.tokens:,} tokens" if group.tokens is not None else "tokens not recorded"
            scores = [run.score(by) for run in group.ranked if run.score(by) is not None]
            low, high = (min(scores), max(scores)) if scores else (0.0, 0.0)
            rows = []
            for index, run in enumerate(group.ranked, start=1):
                score = run.score(by)
                # Bars from 30% (the best) to 100% (the worst) of the cell, so close scores still differ.
                width = (
                    30 + 70 * ((score - low) / (high - low) if high > low else 0) if score is not None else 0
                )
                rows.append(
                    [
                        num(index if score is not None else "-"),
                        f'<span class="bar" style="width:{width:.0f}px"></span> {num(_fmt(score))}'
                        if score is not None
                        else "-",
                        num(_fmt_or_dash(run.eval_loss if by == "bpb" else run.eval_bpb)),
                        num(f"{run.parameters:,}" if run.parameters is not None else "-"),
                        num(f"{run.tokens_per_second:,.0f}" if run.tokens_per_second is not None else "-"),
                        num(f"{run.mfu:.1%}" if run.mfu is not None else "-"),
                        _path_link("train", run.step.relpath),
                        esc(leaderboard.describe_differences(group.differences.get(run.step.path, {}), 200)),
                    ]
                )
            header = ["rank", f"eval/{by}", f"eval/{other}", "params", "tokens/s", "MFU", "run", "differs"]
            body += f"<h2>{esc(tokens)} <span class=muted>({len(rows)})</span></h2>" + table(
                header, rows, "board"
            )
        return self.html("Leaderboard", body)

    def predictions(self, tree: _Tree, rest: str, params: dict) -> Response:
        if rest:
            raise Refused(404, "no such page")
        pattern = (params.get("q") or [""])[0].strip() or None
        if pattern:
            check_name_pattern(pattern)
        try:
            found = predictions.predictions(tree, pattern)
        except ValueError as error:
            raise Refused(400, str(error)) from None
        body = (
            "<h1>Predictions</h1>"
            + self.manifests_html(tree, _UNLISTED_OUTPUTS)
            + f'<form method="get" action="/predictions"><input name="q" value="{esc(pattern or "")}" '
            'placeholder="step-name pattern"> <button>filter</button> '
            "final eval loss predicted before the target trained (band: the interval, diamond: the "
            "prediction, dot: the outcome)</form>"
        )
        if not found:
            body += '<p class="muted">no predictions' + (
                f" matching {esc(pattern)}</p>" if pattern else "</p>"
            )
            return self.html("Predictions", body)
        rows = [
            [
                _path_link("step", p.step.relpath),
                esc(p.label),
                num(_fmt_or_dash(p.predicted_loss)),
                num(_fmt_or_dash(p.actual_loss)),
                num(f"{p.relative_error:+.2%}" if p.relative_error is not None else "-"),
                _verdict_html(p),
                interval_chart(p.predicted_loss, p.interval, p.actual_loss, width=300, height=52),
            ]
            for p in found
        ]
        header = ["prediction", "target", "predicted", "actual", "error", "verdict", "interval"]
        return self.html("Predictions", body + table(header, rows, "predictions"))

    def prediction_html(self, prediction: predictions.Prediction) -> str:
        """The prediction section of a prediction's, its target's or its report's step page."""
        p = prediction
        if p.problem:
            return f'<h2>Prediction</h2><p class="muted">not read: {esc(p.problem)}</p>'
        interval = (
            f"[{p.interval[0]:.4f}, {p.interval[1]:.4f}] ({esc(_percent(p.confidence))})"
            if p.interval
            else "none"
        )
        rows = [
            ("prediction", self.step_link(p.step.path)),
            ("target", esc(p.label)),
            ("predicted final eval loss", num(_fmt_or_dash(p.predicted_loss))),
            ("interval", num(interval)),
            ("written", esc(p.created_at or "?") + ("" if p.intact else " <b>EDITED since</b>")),
            (
                "target run",
                f"{self.step_link(p.target.path)} {badge(p.target.status)}"
                if p.target
                else '<span class="muted">no training step depends on it yet</span>',
            ),
            ("training started", esc(p.training_started_at or "")),
            ("actual", num(_fmt_or_dash(p.actual_loss))),
            ("error", num(f"{p.relative_error:+.2%}" if p.relative_error is not None else "-")),
            ("verdict", _verdict_html(p)),
            (
                "pre-registered",
                {
                    True: "yes",
                    False: "<b>no</b>: " + esc("; ".join(predictions._failed_checks(p))),
                    None: "-",
                }[p.preregistered],
            ),
        ]
        if p.report is not None:
            rows.append(("report", f"{self.step_link(p.report.path)} {badge(p.report.status)}"))
        html = "<h2>Prediction</h2>" + interval_chart(p.predicted_loss, p.interval, p.actual_loss) + kv(rows)
        if p.report is not None and p.report.status == "SUCCESS":
            plot = f"{p.report.relpath}/{predictions.PLOT_FILE}"
            html += (
                f'<p><img class="plot" alt="prediction against the fit" src="{esc(url("raw", plot))}"></p>'
            )
        return html

    def all_steps(self, tree: _Tree, _rest: str, _params: dict) -> Response:
        rows = [
            [
                _path_link("step", step.relpath),
                esc(step.name),
                badge(step.status),
                esc(iso_age(step.last_event.date if step.last_event else None)),
                num(human_duration(step.duration_s)),
            ]
            for step in tree.steps
        ]
        body = f"<h1>All steps <span class=muted>({len(rows)})</span></h1>" + self.manifests_html(
            tree, _UNLISTED_OUTPUTS
        )
        body += table(["output", "name", "status", "age", "duration"], rows)
        return self.html("All steps", body)

    def experiment(self, tree: _Tree, rest: str, params: dict) -> Response:
        if not rest or "/" in rest:
            raise Refused(404, "not found")
        # Its manifest alone (not every manifest, to find it by id): the id is its file name.
        name = f"{rest}.json"
        path = f"{tree.abspath(EXPERIMENTS_DIR)}/{name}"
        exp = tree.load_experiment(FileInfo(path=path, name=name, is_dir=False, size=0, mtime=None))
        if exp is None:
            raise Refused(404, f"no experiment {rest!r}")
        recorded = exp.steps
        not_shown = len(recorded) - MAX_EXPERIMENT_STEPS
        if not_shown > 0:  # the first MAX_EXPERIMENT_STEPS, as the manifest lists them
            exp = Experiment(exp.path, {**exp.record, "steps": recorded[:MAX_EXPERIMENT_STEPS]})
        pairs = tree.experiment_steps(exp)
        with_sizes = _int(params, "sizes", 0, 1) == 1
        sizes = tree.sizes([step for _entry, step in pairs if step]) if with_sizes else {}
        nodes, rows = [], []
        for entry, step in pairs:
            # Manifest fields are untrusted JSON: only strings are used as paths, names, hashes.
            path = exp.output_path(entry, tree.prefix) or ""  # (where the tree is now: it may have moved)
            name = _str(entry.get("name")) or path
            status = step.status if step else "MISSING"
            relpath = self.rel(path)
            deps = _entry_deps(entry, exp, tree.prefix)
            nodes.append(
                Node(
                    key=path,
                    label=name,
                    status=status,
                    href=url("step", relpath) if relpath and _servable(relpath) else url("exp", exp.id),
                    title=f"{entry.get('name')} \u2014 {status}\n{path}",
                    deps=deps,
                )
            )
            row = [
                self.step_link(path, name),
                badge(status),
                f'<span class="mono">{_path_link("file", relpath) if relpath else esc(path)}</span>',
                f'<span class="mono">{esc(_str(entry.get("version_hash"))[:12])}</span>',
                esc(step.started or "") if step else "",
                num(human_duration(step.duration_s) if step else ""),
                esc(entry.get("outcome") or ""),
            ]
            if with_sizes:
                row.append(num(human_size(sizes.get(path)) if step else ""))
            rows.append(row)
        header = ["step", "status", "output path", "version", "started", "duration", "outcome (this run)"]
        if with_sizes:
            header.append("size")
        record = exp.record
        git = exp.git
        command = record.get("command_line")
        command = " ".join(map(str, command)) if isinstance(command, list) else _str(command)
        command = _cut(command, MAX_DESCRIPTION_CHARS)
        counts = Counter(node.status for node in nodes)
        info = kv(
            [
                ("created", esc(exp.created) + f" <span class=muted>{esc(iso_age(exp.created))}</span>"),
                ("finished", esc(record.get("finished_date") or "")),
                ("script", esc(record.get("caller_path") or "")),
                (
                    "command line",
                    f'<span class="mono">{esc(command)}</span>',
                ),
                (
                    "git",
                    f'<span class="mono">{esc(git.get("commit") or "")}</span> {esc(git.get("branch") or "")}'
                    + (" <b>dirty</b>" if git.get("dirty") else ""),
                ),
                ("by", esc(f"{record.get('user') or ''}@{record.get('host') or ''}")),
                ("description", esc(_cut(str(record.get("description") or ""), MAX_DESCRIPTION_CHARS))),
                ("manifest", link(url("file", self.rel(exp.path) or ""), exp.id + ".json")),
                (
                    "steps",
                    " ".join(f"{badge(status)} {count}" for status, count in sorted(counts.items()))
                    + (f" <span class=muted>{not_shown:,} not shown</span>" if not_shown > 0 else ""),
                ),
            ]
        )
        left_out = (
            f'<p class="muted note left-out">{not_shown:,} more steps of this experiment are not shown '
            f"(a page shows at most {MAX_EXPERIMENT_STEPS:,}): "
            f"{link(url('file', self.rel(exp.path) or ''), 'its manifest')} lists them</p>"
            if not_shown > 0
            else ""
        )
        size_link = (
            link(url("exp", exp.id), "hide sizes")
            if with_sizes
            else link(url("exp", exp.id, sizes=1), "show sizes")
        )
        body = (
            f"<h1>Experiment {esc(exp.id)}</h1>{info}<h2>Graph</h2>"
            f'<div class="dagbox">{dag_svg(nodes)}</div>'
            f"<h2>Steps <span class=muted>({len(recorded):,})</span> <small>{size_link}</small></h2>"
            f"{left_out}{table(header, rows, 'steps')}"
        )
        return self.html(exp.id, body)

    # -- one step -------------------------------------------------------------
    def load(self, tree: _Tree, rest: str) -> StepOutput:
        target = self.guard.resolve(rest)
        step = tree.load_step(target.path) if target.relpath else None
        if step is None:
            raise Refused(404, f"no step output at {rest!r}")
        return step

    def dependents(self, tree: _Tree, path: str) -> tuple[dict[str, str], list[Experiment]]:
        """Outputs that read `path` (from the manifests), and the experiments that include it;
        `tree.readers().cut` says when not every manifest was looked at."""
        readers = tree.readers()
        users = dict(readers.users.get(path, {}))
        users.pop("", None)
        return users, list(readers.members.get(path, []))

    def step(self, tree: _Tree, rest: str, params: dict) -> Response:
        step = self.load(tree, rest)
        info = step.info or {}
        users, experiments = self.dependents(tree, step.path)
        experiments = list({exp.id: exp for exp in experiments}.values())  # each once, in order
        incomplete = (
            ' <span class="muted">(may be incomplete: see the note)</span>'
            if tree.manifests_left_out() is not None
            else ""
        )
        run = _dict(info.get("run"))
        git = _dict(run.get("git"))
        overview = kv(
            [
                ("name", esc(step.name)),
                ("status", badge(step.status)),
                ("function", f'<span class="mono">{esc(info.get("fn_name") or "")}</span>'),
                *([("not read", f'<span class="mono">{esc(step.problem)}</span>')] if step.problem else []),
                ("description", esc(info.get("description") or "")),
                ("output path", f'<span class="mono">{esc(step.path)}</span>'),
                ("version hash", f'<span class="mono">{esc(step.version_hash or "")}</span>'),
                ("started", esc(step.started or "")),
                ("finished", esc(step.finished or "")),
                ("duration", esc(human_duration(step.duration_s))),
                (
                    "git",
                    f'<span class="mono">{esc(git.get("commit") or "")}</span>'
                    + (" dirty" if git.get("dirty") else ""),
                ),
                (
                    "experiments",
                    (
                        ", ".join(_path_link("exp", exp.id) for exp in experiments)
                        or '<span class="muted">none</span>'
                    )
                    + incomplete,
                ),
            ]
        )
        upstream = [
            f"<li>{self.step_link(dep.get('output_path') or '', dep.get('name'))}"
            f"{' <span class=muted>(non-blocking)</span>' if dep.get('blocking') is False else ''}</li>"
            for dep in step.dependencies
        ]
        readers = sorted(users.items())
        downstream = [f"<li>{self.step_link(path, name)}</li>" for path, name in readers[:MAX_STEP_READERS]]
        if len(readers) > MAX_STEP_READERS:
            downstream.append(
                f"<li class=muted>{len(readers) - MAX_STEP_READERS:,} more steps read it (a page lists "
                f"at most {MAX_STEP_READERS:,})</li>"
            )
        history = [
            [
                esc(event.date),
                badge(event.status.value),
                f'<span class="mono">{esc(event.worker or "")}</span>',
                num(human_duration(event.extra.get("duration_s"))),
                esc(event.message or ""),
            ]
            for event in step.history
        ]
        all_files = tree.files(step)
        files_offset = _int(params, "files_offset", 0)
        shown = all_files[files_offset : files_offset + FILES_PER_PAGE]
        file_rows = []
        for relname, size in shown:
            file_rel = f"{step.relpath}/{relname}"
            if not _servable(file_rel):
                file_rows.append([_path_link("file", file_rel, relname), num(human_size(size)), ""])
                continue
            links = [link(url("file", file_rel), "view"), link(url("raw", file_rel), "raw")]
            if filepages.is_json_lines(relname):
                links.append(link(url("compare", file_rel), "across steps"))
            file_rows.append(
                [link(url("file", file_rel), relname, "file"), num(human_size(size)), " ".join(links)]
            )
        has_metrics = any(relname == "metrics.jsonl" for relname, _size in all_files)
        body = [
            f"<h1>{esc(step.name)} {badge(step.status)}</h1>",
            overview,
            self.manifests_html(
                tree,
                "The experiments this step belongs to and the steps that read it are found in the "
                "manifests read: both lists may be incomplete.",
            ),
        ]
        prediction = predictions.prediction_of(tree, step)
        if prediction is not None:
            body.append(self.prediction_html(prediction))
        if has_metrics:
            body.append(
                f"<p><b>{link(url('train', step.relpath), 'Training curves and eval results →')}</b></p>"
            )
        body.append("<h2>Dependencies</h2><div style='display:flex;gap:40px'>")
        body.append(
            f"<div><b>reads</b><ul class=upstream>{''.join(upstream) or '<li class=muted>none</li>'}</ul></div>"
        )
        body.append(
            f"<div><b>read by</b><ul class=downstream>{''.join(downstream) or '<li class=muted>none</li>'}</ul></div></div>"
        )
        body.append("<h2>Config</h2>" + pretty_json(info.get("config")))
        body.append(
            "<h2>Version inputs</h2><p class=muted>what the version hash is computed from</p>"
            + pretty_json(info.get("version"))
        )
        body.append(
            "<h2>Status history</h2>" + table(["date", "status", "worker", "duration", "message"], history)
        )
        body.append("<h2>Lease</h2>" + self.lease_html(tree, step))
        body.append("<h2>Log (tail)</h2>" + self.log_html(tree, step))
        total = sum(size for _name, size in all_files)
        body.append(
            f"<h2>Files <span class=muted>({len(all_files)}, {esc(human_size(total))})</span></h2>"
            + table(["file", "size", ""], file_rows, "files")
        )
        if len(all_files) > FILES_PER_PAGE:
            prev_href = (
                url("step", step.relpath, files_offset=max(0, files_offset - FILES_PER_PAGE))
                if files_offset
                else None
            )
            next_off = files_offset + FILES_PER_PAGE
            next_href = (
                url("step", step.relpath, files_offset=next_off) if next_off < len(all_files) else None
            )
            body.append(
                pager(prev_href, next_href, f"files {files_offset + 1}\u2013{files_offset + len(shown)}")
            )
        return self.html(step.name, "".join(body))

    def lease_html(self, tree: _Tree, step: StepOutput) -> str:
        try:
            self.guard.resolve(f"{step.relpath}/{LEASE_FILE}")
        except Refused:
            return '<p class="muted">lease file refused (outside the prefix)</p>'
        lease = tree.lease(step)
        if lease is None:
            return '<p class="muted">no lease held</p>'
        return kv(
            [
                ("holder", f'<span class="mono">{esc(lease.worker)}</span>'),
                ("host / pid", esc(f"{lease.host} / {lease.pid}")),
                ("last heartbeat", esc(f"{time.time() - lease.heartbeat:.1f}s ago")),
            ]
            + (
                [("acquired", esc(f"{time.time() - lease.acquired:.1f}s ago"))]
                if lease.acquired is not None
                else []
            )
        )

    def log_html(self, tree: _Tree, step: StepOutput) -> str:
        try:
            self.guard.resolve(f"{step.relpath}/{LOG_FILE}")
        except Refused:
            return '<p class="muted">log refused (outside the prefix)</p>'
        tail = tree.log_tail(step)
        if tail is None:
            return '<p class="muted">no log</p>'
        full = link(url("file", f"{step.relpath}/{LOG_FILE}"), "whole log (paged)")
        return f'<pre class="log">{esc(tail)}</pre><p>{full}</p>'

    # -- training -------------------------------------------------------------
    def training(self, tree: _Tree, rest: str, _params: dict) -> Response:
        # One read budget for metrics.jsonl, the lookup of the steps that read this one and
        # their results.json.
        budget = filepages.ReadBudget()
        tree.count_reads(budget)
        step = self.load(tree, rest)
        metrics = self.guard.resolve(f"{step.relpath}/metrics.jsonl")
        collected = _Metrics()
        lines = 0
        for _number, record in filepages.iter_records(self.store, metrics, budget=budget):
            lines += 1
            at = finite_number(record.get("step")) if record else None
            if at is None:
                continue
            for key, value in record.items():
                if key in METRIC_KEYS or (key.startswith("eval/") and "time" not in key and "//" not in key):
                    number = finite_number(value)
                    if number is not None:
                        collected.add(key, at, number)  # later lines win, as in read_metrics
        series = collected.series

        def points(key: str) -> list[tuple[float, float]]:
            return series[key].points() if key in series else []

        charts = [
            line_chart(
                "Loss",
                {key: points(key) for key in ("train/loss", "eval/loss") if key in series},
                markers=frozenset({"eval/loss"}),
            )
        ]
        for key in sorted(series):
            if key.startswith("eval/") and key != "eval/loss":
                charts.append(line_chart(key, {key: points(key)}, markers=frozenset({key})))
        if "optim/learning_rate" in series:
            charts.append(line_chart("Learning rate", {"optim/learning_rate": points("optim/learning_rate")}))
        summary_rows = []
        for key in sorted(series):
            kept = series[key]
            values = kept.points()
            if values:
                count = f"{len(values)} of {kept.read} (thinned)" if kept.thinned else str(len(values))
                summary_rows.append(
                    [
                        esc(key),
                        num(f"{values[-1][1]:.6g}"),
                        num(f"{kept.minimum():.6g}"),
                        num(int(values[-1][0])),
                        num(count),
                    ]
                )
        left_out = []
        if collected.left_out:
            many = "at least " if len(collected.left_out) >= MAX_LEFT_OUT_NAMES else ""
            shown = sorted(collected.left_out)[:20]
            left_out.append(
                f"{many}{len(collected.left_out)} more eval/ metrics are not drawn (a page draws at most "
                f"{MAX_SERIES}, the first in the file): "
                + ", ".join(f'<span class="mono">{esc(name)}</span>' for name in shown)
                + (", \u2026" if len(collected.left_out) > len(shown) else "")
            )
        if collected.long_keys:
            left_out.append(
                f"{collected.long_keys} value(s) left out: their names are longer than "
                f"{MAX_METRIC_KEY_CHARS} characters"
            )
        if any(kept.thinned for kept in series.values()):
            left_out.append(
                f"series with more than {MAX_SERIES_POINTS} points were thinned while reading (every "
                "other point, then every other new one); their last point is kept, and their min is "
                "that of every value read"
            )
        body = [
            f"<h1>Training: {esc(step.name)} {badge(step.status)}</h1>",
            f"<p>{link(url('step', step.relpath), '← step page')} \u00b7 "
            f"{link(url('file', metrics.relpath), 'metrics.jsonl')} ({lines} lines)</p>",
            "".join(f'<p class="muted note left-out">{part}</p>' for part in left_out),
            '<div class="charts">' + "".join(charts) + "</div>",
            "<h2>Metrics</h2>"
            + table(["metric", "last", "min", "last step", "points"], summary_rows, "metrics"),
        ]
        body.append("<h2>Eval results</h2>" + self.results_html(tree, step, budget))
        return self.html(f"Training {step.name}", "".join(body))

    def results_html(self, tree: _Tree, step: StepOutput, budget: filepages.ReadBudget) -> str:
        """results.json of this step and of the steps that read it (evaluations): at most
        `MAX_RESULTS_FILES` of them, read within the request's `budget`, each table at most
        `MAX_RESULT_ROWS` values; notes say what was left out."""
        sources = [(step.path, step.name)]
        users, _experiments = self.dependents(tree, step.path)
        sources += sorted(users.items())
        parts = []
        notes = []
        read = 0
        for index, (path, name) in enumerate(sources):
            left = sources[index:]
            if read >= MAX_RESULTS_FILES:
                notes.append(
                    f"{len(left)} more steps that read it were not looked at (a page reads at most "
                    f"{MAX_RESULTS_FILES} results.json): {self._steps_named(left)}"
                )
                break
            relpath = self.rel(path)
            if relpath is None:
                continue
            try:
                target = self.guard.resolve(f"{relpath}/results.json")
                text, cut = filepages.read_head(self.store, target, SMALL_JSON_BYTES, budget)
            except filepages.ReadLimit:
                notes.append(
                    f"{len(left)} more steps not looked at for results.json: {_budget_spent()} "
                    f"(metrics.jsonl, the manifests and results.json together): {self._steps_named(left)}"
                )
                break
            except (Refused, FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError):
                continue
            read += 1
            try:
                value = json.loads(text) if not cut else None
            except (ValueError, RecursionError):
                value = None
            if not isinstance(value, dict):
                parts.append(
                    f"<p>{link(url('file', target.relpath), target.relpath)}: not a small JSON object</p>"
                )
                continue
            rows, more = [], 0
            for key, val in _flatten(value):
                if len(rows) < MAX_RESULT_ROWS:
                    rows.append([esc(_cut(key, MAX_CELL_CHARS)), num(_cut(_fmt(val), MAX_CELL_CHARS))])
                else:
                    more += 1
            parts.append(
                f"<h3>{_path_link('step', relpath, name)} <small>{link(url('file', target.relpath), 'results.json')}"
                f"</small></h3>" + table(["metric", "value"], rows, "results")
            )
            if more:
                parts.append(
                    f'<p class="muted note left-out">{more} more values are not shown (a table shows at '
                    f"most {MAX_RESULT_ROWS}): {link(url('file', target.relpath), 'results.json')}</p>"
                )
        if tree.readers_cut is not None:
            notes.append(f"the steps that read it were not all looked up: {esc(tree.readers_cut)}")
        html = "".join(f'<p class="muted note left-out">{note}</p>' for note in notes)
        return html + (
            "".join(parts) or '<p class="muted">no results.json in this step or the steps that read it</p>'
        )

    def _steps_named(self, sources: list[tuple[str, str]], shown: int = 10) -> str:
        """Links to the first `shown` of (output path, name), and how many more."""
        links = [self.step_link(path, name) for path, name in sources[:shown]]
        more = len(sources) - len(links)
        return ", ".join(links) + (f", and {more} more" if more > 0 else "")

    # -- files ----------------------------------------------------------------
    def is_dir(self, target: Target) -> bool:
        if target.local is not None:
            return os.path.isdir(target.local)
        return bool(self.store.fs.isdir(self.store.fs_path(target.path)))

    def owning_step(self, tree: _Tree, relpath: str) -> StepOutput | None:
        parts = relpath.split("/")
        for end in range(len(parts), 0, -1):
            step = tree.load_step(f"{self.prefix}/{'/'.join(parts[:end])}")
            if step is not None:
                return step
        return None

    def crumbs(self, relpath: str) -> str:
        parts = relpath.split("/") if relpath else []
        out = [link(url("file"), "prefix")]
        for end in range(1, len(parts) + 1):
            out.append(link(url("file", "/".join(parts[:end])), parts[end - 1]))
        return '<p class="crumbs mono">' + " / ".join(out) + "</p>"

    def file(self, tree: _Tree, rest: str, params: dict) -> Response:
        target = self.guard.resolve(rest)
        if self.is_dir(target):
            return self.directory(tree, target, params)
        step = self.owning_step(tree, target.relpath)
        offset = _int(params, "offset", 0)
        limit = _int(params, "limit", filepages.LINES_PER_PAGE, filepages.MAX_LINES_PER_PAGE)
        result = filepages.read_page(self.store, target, offset, limit)
        name = target.relpath.rsplit("/", 1)[-1]
        head = [f"<h1>{esc(name)}</h1>", self.crumbs(target.relpath)]
        facts = [f"{esc(human_size(result.size))}", link(url("raw", target.relpath), "raw")]
        if step is not None:
            facts.insert(0, "step " + link(url("step", step.relpath), step.name))
        if filepages.is_json_lines(name) and step is not None:
            facts.append(link(url("compare", target.relpath), "same documents across steps"))
        head.append("<p>" + " \u00b7 ".join(facts) + "</p>")

        def nav(unit: str) -> str:
            def href(offset: int | None) -> str | None:
                if offset is None:
                    return None
                return url("file", target.relpath, offset=offset, limit=limit if unit != "bytes" else None)

            prev_href, next_href = href(result.prev_offset), href(result.next_offset)
            return pager(prev_href, next_href, _where(result, unit))

        if result.kind == "lines":
            content = nav("lines") + "".join(
                _line_html(number, text, cut) for number, text, cut in result.lines
            )
            if result.note:  # e.g. the per-request read limit ran out after some lines
                content += f'<p class="muted note">{esc(result.note)}</p>'
            content += nav("lines")
        elif result.kind == "text":
            content = nav("bytes") + f'<pre class="text">{esc(result.text)}</pre>'
            if result.note:  # e.g. an offset past the end of the file
                content += f'<p class="muted note">{esc(result.note)}</p>'
            content += nav("bytes")
        elif result.kind == "json":
            content = f'<pre class="json">{esc(result.text)}</pre>'
        elif result.kind == "table":
            rows = [[esc(_cell_text(value)) for value in row] for row in result.rows]
            content = nav("rows") + table(result.columns, rows, "parquet") + nav("rows")
        else:
            content = f'<p class="binary">{esc(result.note)}</p>'
        return self.html(name, "".join(head) + content)

    def directory(self, tree: _Tree, target: Target, params: dict) -> Response:
        entries = tree.list_dir(target.path)
        offset = _int(params, "offset", 0)
        shown = entries[offset : offset + DIR_ENTRIES_PER_PAGE]
        rows = []
        for entry in shown:
            child = f"{target.relpath}/{entry.name}" if target.relpath else entry.name
            if not _servable(child):
                rows.append([esc(entry.name), "", '<span class="muted">name not servable</span>'])
                continue
            rows.append(
                [
                    link(url("file", child), entry.name + ("/" if entry.is_dir else "")),
                    num("" if entry.is_dir else human_size(entry.size)),
                    "",
                ]
            )
        step = tree.load_step(target.path) if target.relpath else None
        head = f"<h1>{esc(target.relpath or self.prefix)}/</h1>{self.crumbs(target.relpath)}"
        if step is not None:
            head += f"<p>step output: {link(url('step', step.relpath), step.name)}</p>"
        prev_href = (
            url("file", target.relpath, offset=max(0, offset - DIR_ENTRIES_PER_PAGE)) if offset else None
        )
        next_off = offset + DIR_ENTRIES_PER_PAGE
        next_href = url("file", target.relpath, offset=next_off) if next_off < len(entries) else None
        nav = (
            pager(prev_href, next_href, f"{len(entries)} entries")
            if len(entries) > DIR_ENTRIES_PER_PAGE
            else ""
        )
        return self.html(
            target.relpath or "prefix", head + nav + table(["name", "size", ""], rows, "listing") + nav
        )

    def raw(self, _tree: _Tree, rest: str, _params: dict) -> Response:
        target = self.guard.resolve(rest)
        if not target.relpath or self.is_dir(target):
            raise Refused(404, "not a file")
        size = filepages.file_size(self.store, target)
        with filepages.open_raw(self.store, target) as handle:
            sample = handle.read(filepages.SNIFF_BYTES)
        textual = not filepages.looks_binary(sample) and filepages.compression_of(target.relpath) is None

        def chunks() -> Iterator[bytes]:
            with filepages.open_raw(self.store, target) as handle:
                while chunk := handle.read(STREAM_CHUNK):
                    yield chunk

        name = target.relpath.rsplit("/", 1)[-1]
        safe_name = "".join(char if char.isalnum() or char in "._-" else "_" for char in name)
        # A PNG (by name and signature) is shown inline, so pages can embed the plots steps draw;
        # with nosniff and the page's CSP an image type cannot run anything.
        image = name.lower().endswith(".png") and sample.startswith(PNG_SIGNATURE)
        inline = textual or image
        headers = {"Content-Disposition": f'{"inline" if inline else "attachment"}; filename="{safe_name}"'}
        content_type = (
            "image/png" if image else "text/plain; charset=utf-8" if textual else "application/octet-stream"
        )
        return Response(200, content_type=content_type, headers=headers, stream=chunks, length=size)

    # -- documents across steps -----------------------------------------------
    def compare(self, tree: _Tree, rest: str, params: dict) -> Response:
        # One read budget for the whole request: the steps' records and the manifests the chain
        # lookup reads (at most MAX_LOOKUP_BYTES, and half the time), every step's file and the
        # source previews. The page reads a shard in up to CHAIN_LIMIT steps, and a budget per
        # file would multiply the limits.
        budget = filepages.ReadBudget()
        tree.count_reads(budget, filepages.MAX_READ_SECONDS * LOOKUP_TIME_SHARE)
        target = self.guard.resolve(rest)
        step = self.owning_step(tree, target.relpath)
        if step is None or target.relpath == step.relpath:
            raise Refused(404, "not a file inside a step output")
        shard = target.relpath[len(step.relpath) + 1 :]
        offset = _int(params, "offset", 0)
        limit = max(1, _int(params, "limit", DOCS_PER_PAGE, MAX_DOCS_PER_PAGE))
        chain, source, lookup_stopped = self.chain(tree, step, shard)
        targets = [self.guard.resolve(f"{item.relpath}/{shard}") for item in chain]
        unread: list[str | None] = [None] * len(chain)  # per step: why its file was not (fully) read

        # The first step's page fixes which documents are shown.
        base: list[tuple[str, dict[str, Any]]] = []
        more = False
        try:
            for _number, record in filepages.iter_records(self.store, targets[0], offset, budget):
                if len(base) == limit:
                    more = True
                    break
                record = record or {}
                base.append((_doc_id(record), record))
        except filepages.ReadLimit as stopped:
            if not base:
                raise
            unread[0] = f"read in part, {len(base)} documents of this page: {stopped.message}"
        wanted = {doc_id for doc_id, _record in base}
        # Later steps keep a subset of the documents, in order: the page's documents are
        # among their first offset+limit lines, so no step is read further than that.
        columns: list[dict[str, dict[str, Any]]] = [dict(base)]
        for index, later in enumerate(targets[1:], start=1):
            found: dict[str, dict[str, Any]] = {}
            if budget.spent:
                unread[index] = "not read: the request's read budget was spent on the steps before"
                columns.append(found)
                continue
            try:
                for number, record in filepages.iter_records(self.store, later, 0, budget):
                    if number >= offset + limit or len(found) == len(wanted):
                        break
                    doc_id = _doc_id(record or {})
                    if doc_id in wanted:
                        found[doc_id] = record or {}
            except FileNotFoundError:
                pass
            except filepages.ReadLimit as stopped:
                unread[index] = f"read in part: {stopped.message}"
            columns.append(found)
        raw_texts: dict[str, str] = {}
        sources_unread: tuple[set[str], str] | None = None  # (documents, why) not read for the limit
        if source is not None:
            raw_texts, sources_unread = self.source_texts(source, base, budget)

        header = ["document"]
        if raw_texts or sources_unread:
            header.append(f"{source.name} (source file)")
        header += [item.name for item in chain]
        rows = []
        dropped_count = Counter()
        for doc_id, _record in base:
            row = [f'<td class="docid mono">{esc(doc_id)}</td>']
            if raw_texts or sources_unread:
                text = raw_texts.get(doc_id)
                if text is not None:
                    row.append(_doc_cell(text, ""))
                elif sources_unread and doc_id in sources_unread[0]:
                    row.append('<td class="unread"><span class="mark">not read (read limit)</span></td>')
                else:
                    row.append('<td class="gone">(no source file)</td>')
            previous_text, gone = None, False
            for index, column in enumerate(columns):
                record = column.get(doc_id)
                if record is None and unread[index] is not None and not gone:
                    # Not found in what was read: kept or dropped, the page cannot tell.
                    row.append('<td class="unread"><span class="mark">not read (read limit)</span></td>')
                    continue
                if record is None:
                    if not gone:
                        row.append(
                            f'<td class="dropped"><span class="mark">dropped by {esc(chain[index].name)}</span></td>'
                        )
                        dropped_count[chain[index].name] += 1
                        gone = True
                    else:
                        row.append('<td class="gone">\u2014</td>')
                    continue
                text = record.get("text")
                text = text if isinstance(text, str) else json.dumps(record, ensure_ascii=False)
                changed = previous_text is not None and text != previous_text
                row.append(_doc_cell(text, "changed" if changed else ""))
                previous_text = text
            rows.append(row)
        shard_links = " \u2192 ".join(
            _path_link("file", f"{item.relpath}/{shard}", item.name) for item in chain
        )
        summary = (
            ", ".join(f"{name}: {count} dropped" for name, count in dropped_count.items()) or "none dropped"
        )
        if any(why is not None for why in unread):
            summary += " (in what was read)"
        prev_href = (
            url("compare", target.relpath, offset=max(0, offset - limit), limit=limit) if offset else None
        )
        next_href = url("compare", target.relpath, offset=offset + limit, limit=limit) if more else None
        nav = pager(prev_href, next_href, f"documents {offset + 1}\u2013{offset + len(base)} of this shard")
        limited = [
            f"<li>{_path_link('file', f'{item.relpath}/{shard}', item.name)}: {esc(why)}</li>"
            for item, why in zip(chain, unread, strict=True)
            if why is not None
        ]
        if sources_unread and source is not None:
            limited.append(
                f"<li>source files of {_path_link('step', source.relpath, source.name)}: not read for "
                f"{len(sources_unread[0])} documents: {esc(sources_unread[1])}</li>"
            )
        stopped_html = (
            '<div class="note read-limit"><p><b>Not every step\'s file was read</b>: the browser reads '
            f"at most {filepages.MAX_READ_BYTES >> 20} MiB, or {filepages.MAX_READ_SECONDS:g} s, of "
            "(decompressed) lines per request, all the steps' files together. A document not found "
            f"in a file not fully read is marked \u201cnot read\u201d.</p><ul>{''.join(limited)}</ul></div>"
            if limited
            else ""
        )
        lookup_html = (
            '<div class="note lookup-limit"><p><b>The chain of steps may go on</b>: finding it reads '
            "the steps' records and the experiment manifests, at most "
            f"{MAX_LOOKUP_BYTES >> 20} MiB of them and "
            f"{filepages.MAX_READ_SECONDS * LOOKUP_TIME_SHARE:g} s of the request's read budget, "
            "and the lookup stopped:</p><ul>"
            + "".join(f"<li>{esc(why)}</li>" for why in lookup_stopped)
            + "</ul></div>"
            if lookup_stopped
            else ""
        )
        body = (
            f"<h1>{esc(shard)} across steps</h1>"
            f"<p>{shard_links}</p><p class=muted>on this page: {esc(summary)}. Steps are linked through their "
            "recorded dependencies; a document is matched by its id.</p>"
            + lookup_html
            + stopped_html
            + nav
            + table(header, rows, "compare")
            + nav
        )
        return self.html(f"{shard} across steps", body)

    def chain(
        self, tree: _Tree, step: StepOutput, shard: str
    ) -> tuple[list[StepOutput], StepOutput | None, list[str]]:
        """Consecutive steps holding the same shard (upstream first), the step before them (a
        source without that shard, e.g. raw files), found via dependencies, and why the lookup
        stopped before the chain's ends (`_Tree.lookup_spent`; empty when it did not)."""
        chain = [step]
        source = None
        seen = {step.path}
        stopped: list[str] = []
        current = step
        while len(chain) < CHAIN_LIMIT and not stopped:
            previous = None
            for dep in current.dependencies:
                why = tree.lookup_spent()
                if why is not None:
                    stopped.append(f"the steps that {current.name} reads were not all looked at: {why}")
                    source = None  # one not looked at may hold the shard
                    break
                candidate = tree.load_step(dep.get("output_path") or "")
                if candidate is None or candidate.path in seen:
                    continue
                if self.has_file(candidate, shard):
                    previous = candidate
                    break
                source = source or candidate
            if previous is None:
                break
            source = None
            seen.add(previous.path)
            chain.insert(0, previous)
            current = previous
        current = step
        while len(chain) < CHAIN_LIMIT and not stopped:
            users, _experiments = self.dependents(tree, current.path)
            following = None
            for path in sorted(users):
                why = tree.lookup_spent()
                if why is not None:
                    stopped.append(f"the steps that read {current.name} were not all looked at: {why}")
                    break
                candidate = tree.load_step(path)
                if candidate is not None and candidate.path not in seen and self.has_file(candidate, shard):
                    following = candidate
                    break
            if following is None:
                break
            seen.add(following.path)
            chain.append(following)
            current = following
        if tree.readers_cut is not None:
            stopped.append(tree.readers_cut)
        return chain, source, stopped

    def has_file(self, step: StepOutput, relname: str) -> bool:
        try:
            target = self.guard.resolve(f"{step.relpath}/{relname}")
        except Refused:
            return False
        if target.local is not None:
            return os.path.isfile(target.local)
        return bool(self.store.fs.isfile(self.store.fs_path(target.path)))

    def source_texts(
        self, source: StepOutput, base: list[tuple[str, dict[str, Any]]], budget: filepages.ReadBudget
    ) -> tuple[dict[str, str], tuple[set[str], str] | None]:
        """The source file of each document (its `metadata.path` or id inside `source`), read
        within the request's `budget`; and (the documents whose source was not looked up, why)
        once it is spent, else None."""
        texts: dict[str, str] = {}
        for index, (doc_id, record) in enumerate(base):
            metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
            for candidate in (metadata.get("path"), doc_id):
                if not isinstance(candidate, str) or not candidate:
                    continue
                try:
                    target = self.guard.resolve(f"{source.relpath}/{check_relpath(candidate)}")
                    if target.local is not None and not os.path.isfile(target.local):
                        continue
                    text, cut = filepages.read_head(self.store, target, RAW_SOURCE_BYTES, budget)
                except filepages.ReadLimit:
                    left = {other for other, _record in base[index:] if other not in texts}
                    return texts, (left, _budget_spent())
                except (Refused, OSError):
                    continue
                texts[doc_id] = text + ("\u2026" if cut else "")
                break
        return texts, None


class _Series:
    """One metric's points (step -> value, later lines win) in bounded memory: past
    `MAX_SERIES_POINTS` every other point is dropped and from then on only every other
    new step is kept (then every fourth, ...). The last step's value and the minimum of
    every value read are kept aside, so the summary does not depend on the thinning."""

    __slots__ = ("values", "stride", "arrivals", "read", "thinned", "last", "low")

    def __init__(self) -> None:
        self.values: dict[float, float] = {}
        self.stride = 1
        self.arrivals = 0
        self.read = 0
        self.thinned = False
        self.last: tuple[float, float] | None = None
        self.low = math.inf

    def add(self, at: float, value: float) -> None:
        self.read += 1
        self.low = min(self.low, value)
        if self.last is None or at >= self.last[0]:
            self.last = (at, value)
        if at in self.values:
            self.values[at] = value
            return
        self.arrivals += 1
        if self.arrivals % self.stride:
            return
        self.values[at] = value
        if len(self.values) > MAX_SERIES_POINTS:
            self.values = dict(sorted(self.values.items())[::2])
            self.stride *= 2
            self.thinned = True

    def points(self) -> list[tuple[float, float]]:
        points = sorted(self.values.items())
        if self.last is not None and self.values.get(self.last[0]) != self.last[1]:
            points = [point for point in points if point[0] != self.last[0]]
            points.append(self.last)
            points.sort()
        return points

    def minimum(self) -> float:
        """Of every step's last value; once thinned, of every value read."""
        if self.thinned:
            return self.low
        return min(value for _at, value in self.points())


class _Metrics:
    """The series a training page draws, bounded: METRIC_KEYS and the first `MAX_SERIES`
    other names; the rest are counted (`left_out`, `long_keys`), not kept."""

    def __init__(self) -> None:
        self.series: dict[str, _Series] = {}
        self.others = 0
        self.left_out: set[str] = set()
        self.long_keys = 0

    def add(self, key: str, at: float, value: float) -> None:
        kept = self.series.get(key)
        if kept is None:
            if len(key) > MAX_METRIC_KEY_CHARS:
                self.long_keys += 1
                return
            if key not in METRIC_KEYS:
                if self.others >= MAX_SERIES:
                    if len(self.left_out) < MAX_LEFT_OUT_NAMES:
                        self.left_out.add(key)
                    return
                self.others += 1
            kept = self.series[key] = _Series()
        kept.add(at, value)


def _budget_spent() -> str:
    return (
        f"the request's read budget ({filepages.MAX_READ_BYTES >> 20} MiB, "
        f"{filepages.MAX_READ_SECONDS:g} s) was spent"
    )


_UNLISTED_OUTPUTS = (
    "Outputs that only the manifests not read name (outside the directories walked) are not listed."
)


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def _manifest_id(path: str) -> str:
    return Experiment(path, {}).id


def _cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}\u2026 ({len(text):,} characters)"


def _dep_path(dep: Any) -> str:
    path = dep.get("output_path") if isinstance(dep, dict) else dep
    return _str(path)


def _entry_deps(entry: dict[str, Any], exp: Experiment, prefix: str) -> tuple[str, ...]:
    """The output paths a manifest entry reads (its `dependencies`: paths or objects), where
    they are under `prefix` now (`Experiment.relocated`)."""
    recorded = entry.get("dependencies")
    if not isinstance(recorded, list):
        return ()
    return tuple(exp.relocated(path, prefix) if path else path for path in map(_dep_path, recorded))


def _str(value: Any) -> str:
    """`value` if the tree recorded a string there, else '' (the tree is untrusted JSON)."""
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _servable(relpath: str) -> bool:
    """Whether a URL can name `relpath` (not a file name that is not UTF-8, nor one `safety`
    refuses, e.g. with a backslash)."""
    try:
        check_relpath(relpath)
    except Refused:
        return False
    return utf8(relpath)


def _path_link(route: str, relpath: str, text: Any = None) -> str:
    """A link to `relpath` under `route`, or its name (escaped) when no URL can name it."""
    if _servable(relpath):
        return link(url(route, relpath), text or relpath)
    return f'<span class="mono">{esc(text or relpath)}</span> <span class="muted">(name not servable)</span>'


def _doc_id(record: dict[str, Any]) -> str:
    value = record.get("id")
    if isinstance(value, str | int):
        return str(value)
    return "sha1:" + hashlib.sha1(str(record.get("text")).encode("utf-8")).hexdigest()[:12]


def _doc_cell(text: str, cls: str) -> str:
    shown = text if len(text) <= DOC_TEXT_CHARS else text[:DOC_TEXT_CHARS] + f"\u2026 ({len(text)} chars)"
    mark = '<span class="mark">changed</span>' if cls == "changed" else ""
    return f'<td class="{cls}">{mark}<pre>{esc(shown)}</pre></td>'


def _line_html(number: int, text: str, cut: bool) -> str:
    note = ' <span class="muted">(line cut: longer than 1 MiB)</span>' if cut else ""
    try:
        value = json.loads(text) if not cut else None
    except (ValueError, RecursionError):
        value = None
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        rest = {key: val for key, val in value.items() if key not in ("text", "id")}
        doc_text = value["text"]
        if len(doc_text) > 20000:
            doc_text = doc_text[:20000] + f"\u2026 ({len(value['text'])} chars)"
        return (
            f'<div class="doc row" data-line="{number}"><b>#{number}</b> '
            f'<span class="mono docid">{esc(value.get("id"))}</span>{note}'
            f"<pre>{esc(doc_text)}</pre>"
            f'<div class="mono muted">{esc(json.dumps(rest, ensure_ascii=False, default=str))}</div></div>'
        )
    shown = json.dumps(value, indent=2, ensure_ascii=False) if value is not None else text
    return f'<div class="doc row" data-line="{number}"><b>#{number}</b>{note}<pre>{esc(shown)}</pre></div>'


def _where(result: filepages.Page, unit: str) -> str:
    if unit == "lines":
        last = result.offset + len(result.lines)
        return f"lines {result.offset + 1}\u2013{last}" if result.lines else f"no lines after {result.offset}"
    if unit == "rows":
        if not result.rows and result.total is not None and result.offset >= result.total:
            return f"no rows after {result.total}"
        return f"rows {result.offset + 1}\u2013{result.offset + len(result.rows)} of {result.total}"
    if result.total is not None and result.offset >= result.total > 0:
        return f"no bytes after {result.total}"
    end = result.next_offset if result.next_offset is not None else result.total
    return f"bytes {result.offset}\u2013{end} of {result.total}"


def _cell_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 300 else text[:300] + "\u2026"


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def _verdict_html(p: predictions.Prediction) -> str:
    fill, stroke = status_colours(
        {"inside": "SUCCESS", "outside": "FAILED", "EDITED": "FAILED"}.get(p.verdict, "")
    )
    return (
        f'<span class="badge verdict" data-verdict="{esc(p.verdict)}" '
        f'style="background:{fill};border-color:{stroke};color:{stroke}">{esc(p.verdict)}</span>'
    )


def _percent(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def _fmt_or_dash(value: float | None) -> str:
    return "-" if value is None else _fmt(value)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | dict):
        return json.dumps(value, ensure_ascii=False)[:300]
    return str(value)
