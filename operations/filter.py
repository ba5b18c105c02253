"""Heuristic quality filters: drop documents by named rules, count every drop, keep a few examples.

A filter step runs a tuple of *rules* over every document. Rules are small frozen
dataclasses registered by name (`RULES`); each one either passes a document or rejects it
with a reason. A document is dropped by the FIRST rule, in config order, that rejects it,
so every dropped document is counted exactly once, against one rule and one reason.

Two families of rules:

- our own simple rules (`MinLength`, `MaxLength`, `MaxLineLength`, `AlphanumericRatio`,
  `SymbolRatio`, `MaxDuplicateLineFraction`, `MinQualityScore`), cheap and
  code-friendly;
- wrappers around datatrove's filter blocks (`Gopher`, `GopherRepetition`, `C4`,
  `FineWeb`), whose fields are the blocks' own parameters with the blocks' defaults. We
  call a block's `filter(Document)` per document rather than running a datatrove
  pipeline, and report the block's own drop reason (`gopher_short_doc`, ...).

datatrove's English word splitter is spaCy, which this project does not install; by
default (`language=None`) the wrappers use `RegexWordTokenizer` instead (words with
inner `.'-`, and every other non-space character as its own token -- close to spaCy's
prefix/suffix splitting, not identical). Set `language="en"` (etc.) to use datatrove's
tokenizer for that language where its dependency is installed.

Presets: the embedded corpus is source code (the Python standard library), for which
web-text rules drop nearly everything (Gopher's stop-word rule, C4's curly-bracket and
punctuation rules). `default_code_rules()` keeps ordinary `.py` files and drops empty,
huge, binary-looking, symbol-soup and very repetitive ones; `default_web_rules()` is
FineWeb's recipe (Gopher repetition, Gopher quality, C4 without the terminal-punctuation
line rule, FineWeb) behind a length and binary guard.

Outputs under `output_path`: kept documents in shards that map 1:1 to the input shards
(`map_shards`: parallel, atomic, resumable, byte-identical on rerun; the C4 rule may
rewrite a kept document's text, as datatrove's block does), and `stats.json` with
document counts, per-rule `checked`/`dropped`/`passed` counts and reasons, and
`dropped_samples`: up to `sample_dropped` dropped documents PER RULE (id, rule, reason,
an excerpt). The sample is the documents with the smallest hash of their id, so it is
deterministic, independent of shard layout and worker count, and spread over the corpus.

Refused (before anything is written): a rule value out of range (each rule's `validate`),
an output_path that holds the input shards, and a re-run into an output made with other
rules or whose finished shards came from other input shards (`.filter_parameters.json`).
Refused after the shards: input with no document, and rules that drop every document (then
stats.json is written first, with an `error` entry): an empty output would only fail the
steps after it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import heapq
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from operations.shards import (
    DataError,
    document_writer,
    finished_shards,
    join,
    list_input_shards,
    map_shards,
    read_json,
    read_numbered_documents,
    refuse_output_among_inputs,
    shard_name,
    sum_counters,
    write_json_atomic,
    write_stats,
)

Check = Callable[[dict[str, Any]], str | None]
"""A built rule: returns None to pass a document, or the reason it is dropped. It may
rewrite `document["text"]` (only `C4` does)."""

RULES: dict[str, type[RuleConfig]] = {}
"""Rule classes by their registered name (the key used in stats and `make_rule`)."""


@dataclass(frozen=True)
class RuleConfig:
    """Base of all rules; subclasses register themselves with `class X(RuleConfig, name="x")`."""

    rule_name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:
            return
        if name in RULES:
            raise ValueError(
                f"rule name {name!r} is registered twice ({RULES[name].__name__}, {cls.__name__})"
            )
        cls.rule_name = name
        RULES[name] = cls

    def build(self) -> Check:
        """The runtime check for this rule (built once per shard, in the worker)."""
        return self.check

    def validate(self) -> None:
        """Raise ValueError naming a field whose value is out of range (called by `filter_documents`,
        not at construction: configs may hold `versioned(...)` wrappers until the step runs)."""

    def check(self, document: dict[str, Any]) -> str | None:
        raise NotImplementedError


def _bad(rule: RuleConfig, field: str, problem: str) -> ValueError:
    return ValueError(f"{type(rule).__name__}.{field}={getattr(rule, field)!r}: {problem}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _need_int(rule: RuleConfig, field: str, low: int, *, optional: bool = False) -> None:
    value = getattr(rule, field)
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        disabled = " (or None to disable it)" if optional else ""
        raise _bad(rule, field, f"must be an integer >= {low}{disabled}")


def _need_number(
    rule: RuleConfig, field: str, low: float, high: float | None, *, optional: bool = False
) -> None:
    value = getattr(rule, field)
    if optional and value is None:
        return
    if not _is_number(value) or not (low <= value and (high is None or value <= high)):
        where = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        disabled = " (or None to disable it)" if optional else ""
        raise _bad(rule, field, f"must be a number {where}{disabled}")


def _need_fraction(rule: RuleConfig, field: str, *, optional: bool = False) -> None:
    _need_number(rule, field, 0.0, 1.0, optional=optional)


def _need_order(rule: RuleConfig, low: str, high: str) -> None:
    if (
        getattr(rule, low) is not None
        and getattr(rule, high) is not None
        and getattr(rule, low) > getattr(rule, high)
    ):
        raise _bad(
            rule, low, f"is larger than {high}={getattr(rule, high)!r}, so every document would be dropped"
        )


def make_rule(name: str, **fields: Any) -> RuleConfig:
    """A rule from its registered name and fields, e.g. `make_rule("min_length", min_chars=20)`."""
    if name not in RULES:
        raise ValueError(f"unknown filter rule {name!r}; known rules: {', '.join(sorted(RULES))}")
    return RULES[name](**fields)


# --- simple rules -------------------------------------------------------------------------


@dataclass(frozen=True)
class MinLength(RuleConfig, name="min_length"):
    """Drop documents shorter than `min_chars` characters (after stripping outer whitespace)."""

    min_chars: int
    """Smallest length kept, in characters of `text.strip()`."""

    def validate(self) -> None:
        _need_int(self, "min_chars", 0)

    def check(self, document: dict[str, Any]) -> str | None:
        return "too_short" if len(document["text"].strip()) < self.min_chars else None


@dataclass(frozen=True)
class MaxLength(RuleConfig, name="max_length"):
    """Drop documents longer than `max_chars` characters."""

    max_chars: int
    """Largest length kept, in characters of the whole text."""

    def validate(self) -> None:
        _need_int(self, "max_chars", 1)

    def check(self, document: dict[str, Any]) -> str | None:
        return "too_long" if len(document["text"]) > self.max_chars else None


@dataclass(frozen=True)
class MaxLineLength(RuleConfig, name="max_line_length"):
    """Drop documents with any line longer than `max_chars` (minified code, base64 blobs)."""

    max_chars: int
    """Longest line kept, in characters."""

    def validate(self) -> None:
        _need_int(self, "max_chars", 1)

    def check(self, document: dict[str, Any]) -> str | None:
        longest = max((len(line) for line in document["text"].splitlines()), default=0)
        return "long_line" if longest > self.max_chars else None


def _non_space(text: str) -> str:
    return "".join(text.split())


@dataclass(frozen=True)
class AlphanumericRatio(RuleConfig, name="alphanumeric_ratio"):
    """Drop symbol soup: documents whose non-whitespace characters are mostly not letters/digits."""

    min_ratio: float
    """Smallest fraction of letters and digits (`str.isalnum`, any script) among the
    non-whitespace characters; whitespace is left out so indentation does not count."""

    def validate(self) -> None:
        _need_fraction(self, "min_ratio")

    def check(self, document: dict[str, Any]) -> str | None:
        chars = _non_space(document["text"])
        if not chars:
            return "empty"
        ratio = sum(map(str.isalnum, chars)) / len(chars)
        return "low_alphanumeric_ratio" if ratio < self.min_ratio else None


_ASCII_PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True)
class SymbolRatio(RuleConfig, name="symbol_ratio"):
    """Drop binary-looking text: too many characters that are neither letters/digits,
    whitespace nor ASCII punctuation (control characters, U+FFFD, box drawing, emoji, ...)."""

    max_ratio: float
    """Largest fraction of such symbols among the non-whitespace characters kept."""

    def validate(self) -> None:
        _need_fraction(self, "max_ratio")

    def check(self, document: dict[str, Any]) -> str | None:
        chars = _non_space(document["text"])
        if not chars:
            return "empty"
        symbols = sum(1 for char in chars if not char.isalnum() and char not in _ASCII_PUNCTUATION)
        return "high_symbol_ratio" if symbols / len(chars) > self.max_ratio else None


@dataclass(frozen=True)
class MaxDuplicateLineFraction(RuleConfig, name="max_duplicate_line_fraction"):
    """Drop very repetitive documents: too many lines that repeat an earlier line."""

    max_fraction: float
    """Largest fraction of duplicate lines kept (a line counts as a duplicate from its
    second occurrence on; lines compared after stripping outer whitespace)."""
    min_line_chars: int = 1
    """Lines shorter than this (after stripping) are ignored; 1 ignores only blank lines."""

    def validate(self) -> None:
        _need_fraction(self, "max_fraction")
        _need_int(self, "min_line_chars", 0)

    def check(self, document: dict[str, Any]) -> str | None:
        seen: set[str] = set()
        lines = duplicates = 0
        for line in document["text"].splitlines():
            line = line.strip()
            if len(line) < max(self.min_line_chars, 1):
                continue
            lines += 1
            if line in seen:
                duplicates += 1
            else:
                seen.add(line)
        return "duplicate_lines" if lines and duplicates / lines > self.max_fraction else None


@dataclass(frozen=True)
class MinQualityScore(RuleConfig, name="min_quality_score"):
    """Drop documents whose classifier score (see `operations.quality_classifier`) is below `min_score`."""

    min_score: float
    """Smallest score kept (scores are probabilities in [0, 1])."""
    key: str = "quality_score"
    """The `metadata` field holding the score."""

    def validate(self) -> None:
        _need_fraction(self, "min_score")
        if not isinstance(self.key, str) or not self.key:
            raise _bad(self, "key", "must name the metadata field holding the score")

    def check(self, document: dict[str, Any]) -> str | None:
        score = (document.get("metadata") or {}).get(self.key)
        if not isinstance(score, (int, float)) or isinstance(score, bool):
            raise ValueError(
                f"document {document.get('id')!r} has no numeric metadata[{self.key!r}] "
                f"(found {score!r}); score the documents first with operations.quality_classifier.score_quality"
            )
        return "low_quality_score" if score < self.min_score else None


# --- datatrove-backed rules ---------------------------------------------------------------


def _regex_tokenizer_class() -> type:
    from datatrove.utils.word_tokenizers import WhitespaceTokenizer

    class RegexWordTokenizer(WhitespaceTokenizer):
        """datatrove word tokenizer without spaCy: words (with inner `.'-`) and single symbols.

        Sentence splitting is datatrove's `WhitespaceTokenizer` regex (no spaCy needed).
        """

        _words = re.compile(r"\w+(?:[.'’\-]\w+)*|[^\w\s]")

        def word_tokenize(self, text: str) -> list[str]:
            return self._words.findall(text)

    return RegexWordTokenizer


@functools.cache
def regex_word_tokenizer() -> Any:
    # One instance per process: datatrove caches split results keyed by the tokenizer
    # object, so Gopher and GopherRepetition share the split of the same text.
    return _regex_tokenizer_class()()


def _language(language: str | None) -> Any:
    return regex_word_tokenizer() if language is None else language


@dataclass(frozen=True)
class _DatatroveRule(RuleConfig):
    """Runs one datatrove filter block per document; its drop reason becomes ours."""

    def block(self) -> Any:
        raise NotImplementedError

    def build(self) -> Check:
        from datatrove.data import Document

        block = self.block()
        rewrites = getattr(self, "rewrite_text", False)

        def check(document: dict[str, Any]) -> str | None:
            text = document["text"]
            if not text.strip():
                # Several blocks divide by the word or character count.
                return "empty"
            doc = Document(
                text=text, id=str(document.get("id")), metadata=dict(document.get("metadata") or {})
            )
            result = block.filter(doc)
            keep, reason = result if isinstance(result, tuple) else (result, None)
            if not keep:
                return reason or self.rule_name
            if rewrites:
                document["text"] = doc.text
            return None

        return check


@dataclass(frozen=True)
class Gopher(_DatatroveRule, name="gopher"):
    """datatrove's GopherQualityFilter (Rae et al. 2021, Gopher's quality rules); defaults are datatrove's."""

    min_doc_words: int | None = 50
    """Fewest words (not counting pure-punctuation tokens); None disables."""
    max_doc_words: int | None = 100_000
    """Most words; None disables."""
    min_avg_word_length: int | None = 3
    """Smallest mean word length in characters; None disables."""
    max_avg_word_length: int | None = 10
    """Largest mean word length in characters; None disables."""
    max_symbol_word_ratio: float | None = 0.1
    """Largest ratio of `#` (and, separately, of ellipses) to words; None disables."""
    max_bullet_lines_ratio: float | None = 0.9
    """Largest fraction of lines starting with a bullet; None disables."""
    max_ellipsis_lines_ratio: float | None = 0.3
    """Largest fraction of lines ending with an ellipsis; None disables."""
    max_non_alpha_words_ratio: float | None = 0.8
    """Despite its (datatrove's) name: the SMALLEST fraction of words with a letter; None disables."""
    min_stop_words: int | None = 2
    """Fewest distinct stop words present; None disables."""
    stop_words: tuple[str, ...] | None = None
    """Stop words; None means datatrove's English list (the, be, to, of, and, that, have, with)."""
    language: str | None = None
    """None: `RegexWordTokenizer`; a language code: datatrove's tokenizer for it (may need spaCy)."""

    def validate(self) -> None:
        for field in ("min_doc_words", "max_doc_words", "min_stop_words"):
            _need_int(self, field, 0, optional=True)
        for field in ("min_avg_word_length", "max_avg_word_length", "max_symbol_word_ratio"):
            _need_number(self, field, 0.0, None, optional=True)
        for field in ("max_bullet_lines_ratio", "max_ellipsis_lines_ratio", "max_non_alpha_words_ratio"):
            _need_fraction(self, field, optional=True)
        _need_order(self, "min_doc_words", "max_doc_words")
        _need_order(self, "min_avg_word_length", "max_avg_word_length")
        if self.stop_words is not None and (
            not isinstance(self.stop_words, (tuple, list))
            or not all(isinstance(w, str) for w in self.stop_words)
        ):
            raise _bad(self, "stop_words", "must be a tuple of words (or None for datatrove's list)")

    def block(self) -> Any:
        from datatrove.pipeline.filters.gopher_quality_filter import GopherQualityFilter

        return GopherQualityFilter(
            min_doc_words=self.min_doc_words,
            max_doc_words=self.max_doc_words,
            min_avg_word_length=self.min_avg_word_length,
            max_avg_word_length=self.max_avg_word_length,
            max_symbol_word_ratio=self.max_symbol_word_ratio,
            max_bullet_lines_ratio=self.max_bullet_lines_ratio,
            max_ellipsis_lines_ratio=self.max_ellipsis_lines_ratio,
            max_non_alpha_words_ratio=self.max_non_alpha_words_ratio,
            min_stop_words=self.min_stop_words,
            stop_words=None if self.stop_words is None else list(self.stop_words),
            language=_language(self.language),
        )


@dataclass(frozen=True)
class GopherRepetition(_DatatroveRule, name="gopher_repetition"):
    """datatrove's GopherRepetitionFilter (Gopher's repetition rules, Table A1); defaults are datatrove's."""

    dup_line_frac: float | None = 0.3
    """Largest fraction of duplicate lines; None disables."""
    dup_para_frac: float | None = 0.3
    """Largest fraction of duplicate paragraphs; None disables."""
    dup_line_char_frac: float | None = 0.2
    """Largest fraction of characters in duplicate lines; None disables."""
    dup_para_char_frac: float | None = 0.2
    """Largest fraction of characters in duplicate paragraphs; None disables."""
    top_n_grams: tuple[tuple[int, float], ...] = ((2, 0.2), (3, 0.18), (4, 0.16))
    """(n, largest character fraction covered by the most frequent word n-gram)."""
    dup_n_grams: tuple[tuple[int, float], ...] = (
        (5, 0.15),
        (6, 0.14),
        (7, 0.13),
        (8, 0.12),
        (9, 0.11),
        (10, 0.10),
    )
    """(n, largest character fraction covered by repeated word n-grams)."""
    language: str | None = None
    """None: `RegexWordTokenizer`; a language code: datatrove's tokenizer for it (may need spaCy)."""

    def validate(self) -> None:
        for field in ("dup_line_frac", "dup_para_frac", "dup_line_char_frac", "dup_para_char_frac"):
            _need_fraction(self, field, optional=True)
        for field in ("top_n_grams", "dup_n_grams"):
            pairs = getattr(self, field)
            if not isinstance(pairs, (tuple, list)) or not all(
                isinstance(pair, (tuple, list))
                and len(pair) == 2
                and isinstance(pair[0], int)
                and not isinstance(pair[0], bool)
                and pair[0] >= 1
                and _is_number(pair[1])
                and 0 <= pair[1] <= 1
                for pair in pairs
            ):
                raise _bad(self, field, "must be a tuple of (n >= 1, fraction between 0 and 1) pairs")

    def block(self) -> Any:
        from datatrove.pipeline.filters.gopher_repetition_filter import GopherRepetitionFilter

        return GopherRepetitionFilter(
            dup_line_frac=self.dup_line_frac,
            dup_para_frac=self.dup_para_frac,
            dup_line_char_frac=self.dup_line_char_frac,
            dup_para_char_frac=self.dup_para_char_frac,
            top_n_grams=self.top_n_grams,
            dup_n_grams=self.dup_n_grams,
            language=_language(self.language),
        )


@dataclass(frozen=True)
class C4(_DatatroveRule, name="c4"):
    """datatrove's C4QualityFilter (Raffel et al. 2020): line rules plus document rules; defaults are datatrove's."""

    split_paragraph: bool = True
    """Apply the line rules to lines (True, as C4) or to sentences (False)."""
    remove_citations: bool = True
    """Remove Wikipedia-style citations like `[1]` from kept lines."""
    filter_no_terminal_punct: bool = True
    """Drop lines that do not end in terminal punctuation."""
    min_num_sentences: int = 5
    """Drop documents with fewer sentences left after the line rules; -1 disables."""
    min_words_per_line: int = 3
    """Drop lines with fewer words; -1 disables."""
    max_word_length: int = 1000
    """Drop lines with a longer word; -1 disables."""
    filter_lorem_ipsum: bool = True
    """Drop documents containing "lorem ipsum"."""
    filter_javascript: bool = True
    """Drop lines mentioning "javascript"."""
    filter_curly_bracket: bool = True
    """Drop documents containing `{` (this drops most code)."""
    filter_policy: bool = True
    """Drop lines about cookies / terms of use / privacy policies."""
    rewrite_text: bool = True
    """Keep only the lines that passed the line rules in a kept document (as C4 and
    datatrove do); False keeps the original text and uses C4 only to decide."""
    language: str | None = None
    """None: `RegexWordTokenizer`; a language code: datatrove's tokenizer for it (may need spaCy)."""

    def validate(self) -> None:
        for field in ("min_num_sentences", "min_words_per_line", "max_word_length"):
            _need_int(self, field, -1)

    def block(self) -> Any:
        from datatrove.pipeline.filters.c4_filters import C4QualityFilter

        return C4QualityFilter(
            split_paragraph=self.split_paragraph,
            remove_citations=self.remove_citations,
            filter_no_terminal_punct=self.filter_no_terminal_punct,
            min_num_sentences=self.min_num_sentences,
            min_words_per_line=self.min_words_per_line,
            max_word_length=self.max_word_length,
            filter_lorem_ipsum=self.filter_lorem_ipsum,
            filter_javascript=self.filter_javascript,
            filter_curly_bracket=self.filter_curly_bracket,
            filter_policy=self.filter_policy,
            language=_language(self.language),
        )


@dataclass(frozen=True)
class FineWeb(_DatatroveRule, name="fineweb"):
    """datatrove's FineWebQualityFilter (Penedo et al. 2024); defaults are datatrove's."""

    line_punct_thr: float = 0.12
    """Smallest fraction of lines ending in terminal punctuation."""
    line_punct_exclude_zero: bool = False
    """Do not apply `line_punct_thr` to documents with no such line at all."""
    stop_chars: tuple[str, ...] | None = None
    """Line-ending characters that count as terminal; None means datatrove's set."""
    short_line_thr: float = 0.67
    """Largest fraction of short lines."""
    short_line_length: int = 30
    """A line of at most this many characters is short."""
    char_duplicates_ratio: float = 0.01
    """Largest fraction of characters in duplicate lines."""
    new_line_ratio: float = 0.3
    """Largest ratio of newlines to words (list-like pages)."""
    language: str | None = None
    """None: `RegexWordTokenizer`; a language code: datatrove's tokenizer for it (may need spaCy)."""

    def validate(self) -> None:
        for field in ("line_punct_thr", "short_line_thr", "char_duplicates_ratio"):
            _need_fraction(self, field)
        _need_int(self, "short_line_length", 0)
        _need_number(self, "new_line_ratio", 0.0, None)

    def block(self) -> Any:
        from datatrove.pipeline.filters.fineweb_quality_filter import FineWebQualityFilter

        return FineWebQualityFilter(
            line_punct_thr=self.line_punct_thr,
            line_punct_exclude_zero=self.line_punct_exclude_zero,
            stop_chars=self.stop_chars,
            short_line_thr=self.short_line_thr,
            short_line_length=self.short_line_length,
            char_duplicates_ratio=self.char_duplicates_ratio,
            new_line_ratio=self.new_line_ratio,
            language=_language(self.language),
        )


# --- presets --------------------------------------------------------------------------------


def default_code_rules() -> tuple[RuleConfig, ...]:
    """Rules for source code, tuned on the Python 3.11 standard library (1,786 files).

    Measured there: 28 files are empty and 61 shorter than 50 characters; the longest file
    is 756k characters (pydoc_data/topics.py), the longest line 1,181 characters; the
    alphanumeric share of non-space characters is >= 0.72 for 95% of files; symbols
    outside ASCII punctuation are at most 4.5%; duplicate lines reach 0.88 at most
    (test_exception_variations.py), 0.53 at the 99th percentile.
    """
    return (
        MinLength(min_chars=20),
        MaxLength(max_chars=1_000_000),
        MaxLineLength(max_chars=3_000),
        SymbolRatio(max_ratio=0.1),
        AlphanumericRatio(min_ratio=0.4),
        MaxDuplicateLineFraction(max_fraction=0.9),
    )


def default_web_rules() -> tuple[RuleConfig, ...]:
    """FineWeb's heuristic recipe (datatrove's blocks, in FineWeb's order) behind a length and binary guard."""
    return (
        MinLength(min_chars=200),
        MaxLength(max_chars=1_000_000),
        SymbolRatio(max_ratio=0.2),
        GopherRepetition(),
        Gopher(),
        C4(filter_no_terminal_punct=False),
        FineWeb(),
    )


# --- the operation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterConfig:
    """Keep the documents that pass every rule; count and sample the rest."""

    input_path: str
    """A directory of document shards (or one shard)."""
    output_path: str
    """Where kept shards, `stats.json` (counts, reasons, dropped samples) go."""
    rules: tuple[RuleConfig, ...]
    """Rules in the order they are tried; the first that rejects a document drops it."""
    sample_dropped: int = 20
    """Dropped documents kept as examples in stats.json, per rule (0: none)."""
    excerpt_chars: int = 300
    """Characters of text kept in each dropped example."""
    workers: int | None = None
    """Parallel processes over shards (None: one per core)."""


def _validate(config: FilterConfig) -> None:
    if not isinstance(config.rules, tuple):
        raise ValueError(f"FilterConfig.rules must be a tuple of rules, got {type(config.rules).__name__}")
    names = []
    for position, rule in enumerate(config.rules):
        if not isinstance(rule, RuleConfig) or not rule.rule_name:
            raise ValueError(
                f"FilterConfig.rules[{position}] is {rule!r}, not a registered rule; "
                f"use one of {', '.join(sorted(RULES))} (or make_rule(name, **fields))"
            )
        try:
            rule.validate()
        except ValueError as error:
            raise ValueError(f"FilterConfig.rules[{position}] {error}") from None
        names.append(rule.rule_name)
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(
            f"FilterConfig.rules uses {', '.join(duplicated)} more than once; stats are kept per rule "
            "name, so merge those rules into one"
        )
    if config.sample_dropped < 0 or config.excerpt_chars < 0:
        raise ValueError("FilterConfig.sample_dropped and excerpt_chars must be >= 0")


def _sample_key(document_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(document_id.encode("utf-8"), digest_size=8).digest(), "big")


_MAKE_SHARDS_FIX = "or make the shards with operations.documents, which skips and counts such records"


def _check_document(document: dict[str, Any], shard: str, line: int) -> None:
    if not isinstance(document.get("text"), str):
        raise DataError(
            f"{shard}, line {line} (id {document.get('id')!r}): field 'text' must be a string, "
            f"got {'null' if document.get('text') is None else type(document.get('text')).__name__}; "
            f"fix the shard, {_MAKE_SHARDS_FIX}"
        )
    if "id" not in document:
        raise DataError(
            f"{shard}, line {line}: missing field 'id'; every document needs one -- fix the shard, {_MAKE_SHARDS_FIX}"
        )


def filter_shard(config: FilterConfig, input_shard: str, output_shard: str) -> dict[str, Any]:
    """Filter one shard (the per-shard function given to `map_shards`); returns its counters."""
    rules = [(rule.rule_name, rule.build()) for rule in config.rules]
    per_rule = {name: {"checked": 0, "dropped": 0, "passed": 0, "reasons": {}} for name, _ in rules}
    documents = {"input": 0, "kept": 0, "dropped": 0}
    chars = {"input": 0, "kept": 0}
    # Bottom-k by id hash per rule: a max-heap of (negated key, sequence, sample).
    samples: dict[str, list[tuple[int, int, dict[str, Any]]]] = {name: [] for name, _ in rules}
    with document_writer(output_shard) as write:
        for number, (line, document) in enumerate(read_numbered_documents(input_shard), 1):
            _check_document(document, input_shard, line)
            documents["input"] += 1
            chars["input"] += len(document["text"])
            dropped_by = None
            for name, check in rules:
                original = document["text"]
                per_rule[name]["checked"] += 1
                try:
                    reason = check(document)
                except ValueError as error:
                    raise DataError(f"{input_shard}, line {line}, rule {name!r}: {error}") from error
                if reason is not None:
                    dropped_by = (name, reason, original)
                    break
                per_rule[name]["passed"] += 1
                if document["text"] is not original and document["text"] != original:
                    per_rule[name]["rewritten"] = per_rule[name].get("rewritten", 0) + 1
            if dropped_by is None:
                documents["kept"] += 1
                chars["kept"] += len(document["text"])
                write(document)
                continue
            name, reason, text = dropped_by
            documents["dropped"] += 1
            per_rule[name]["dropped"] += 1
            per_rule[name]["reasons"][reason] = per_rule[name]["reasons"].get(reason, 0) + 1
            if config.sample_dropped:
                document_id = str(document["id"])
                key = _sample_key(document_id)
                sample = {
                    "id": document_id,
                    "rule": name,
                    "reason": reason,
                    "chars": len(text),
                    "excerpt": text[: config.excerpt_chars],
                }
                heap = samples[name]
                entry = (-key, number, sample)  # negated: the heap's top is the largest key kept
                if len(heap) < config.sample_dropped:
                    heapq.heappush(heap, entry)
                elif key < -heap[0][0]:
                    heapq.heapreplace(heap, entry)
    return {
        "documents": documents,
        "chars": chars,
        "rules": per_rule,
        "dropped_samples": [entry[2] for heap in samples.values() for entry in heap],
    }


def _merge_samples(config: FilterConfig, per_shard: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_rule: dict[str, list[dict[str, Any]]] = {rule.rule_name: [] for rule in config.rules}
    for stats in per_shard:
        for sample in stats.get("dropped_samples", []):
            by_rule.setdefault(sample["rule"], []).append(sample)
    merged = []
    for samples in by_rule.values():
        samples.sort(key=lambda sample: (_sample_key(sample["id"]), sample["id"]))
        merged.extend(samples[: config.sample_dropped])
    return merged


PARAMETERS_FILE = ".filter_parameters.json"


def _input_identity(inputs: list[str]) -> list[list[Any]]:
    """Each input shard's name and size (location-independent, so a moved tree still resumes)."""
    import fsspec

    identity = []
    for shard in inputs:
        fs, path = fsspec.core.url_to_fs(shard)
        identity.append([shard.rstrip("/").rsplit("/", 1)[-1], fs.size(path)])
    return identity


def _check_parameters(config: FilterConfig, inputs: list[str]) -> None:
    """Refuse to resume into an output whose finished shards were made with other rules, or from
    other input shards: `map_shards` keeps a finished shard as it is, and stats.json would credit
    it to this run. With no shard finished, or for the shards not finished yet, anything may
    change (a bad shard fixed, or a rule changed, after a failed run)."""
    rules = json.loads(
        json.dumps(
            {
                "rules": [{"rule": rule.rule_name, **dataclasses.asdict(rule)} for rule in config.rules],
                "sample_dropped": config.sample_dropped,
                "excerpt_chars": config.excerpt_chars,
            }
        )
    )
    identity = _input_identity(inputs)
    path = join(config.output_path, PARAMETERS_FILE)
    earlier = read_json(path)
    fix = f"use a fresh output_path, or delete {config.output_path} to start over"
    finished = (
        set()
        if earlier is None
        else finished_shards(config.output_path, max(len(inputs), len(earlier["inputs"])))
    )
    if finished and {key: earlier.get(key) for key in rules} != rules:
        raise ValueError(
            f"filter: {config.output_path} holds shards filtered with other rules (or sampling) than this "
            f"run's; they would be kept as they are -- {fix}"
        )
    changed = [
        index
        for index in sorted(finished)
        if index >= len(inputs)
        or index >= len(earlier["inputs"])
        or earlier["inputs"][index] != identity[index]
    ]
    if changed:
        names = ", ".join(shard_name(index) for index in changed[:5])
        raise ValueError(
            f"filter: {config.output_path} holds shards ({names}) filtered from other input shards than "
            f"this run's (names or sizes differ under {config.input_path}); they would be kept as they are "
            f"-- {fix}"
        )
    write_json_atomic(path, {**rules, "inputs": identity})


def filter_documents(config: FilterConfig) -> None:
    """Run `config.rules` over every document under `config.input_path`; see the module docstring."""
    _validate(config)
    inputs = list_input_shards(config.input_path, "filter")
    refuse_output_among_inputs(inputs, config.output_path, "filter")
    _check_parameters(config, inputs)
    per_shard = map_shards(
        functools.partial(filter_shard, config),
        inputs,
        config.output_path,
        workers=config.workers,
        description="filter",
    )
    samples = _merge_samples(config, per_shard)
    totals = sum_counters(
        {key: value for key, value in stats.items() if key != "dropped_samples"} for stats in per_shard
    )
    totals["shards"] = len(inputs)
    totals["rule_order"] = [rule.rule_name for rule in config.rules]
    totals["rule_configs"] = [{"rule": rule.rule_name, **dataclasses.asdict(rule)} for rule in config.rules]
    totals["dropped_samples"] = samples
    documents = totals.get("documents", {})
    if not documents.get("input"):
        raise DataError(
            f"filter: no documents in the {len(inputs)} input shard(s) under {config.input_path}: the step "
            "before wrote empty shards -- check its stats.json"
        )
    if not documents.get("kept"):
        by_rule = sorted(
            ((counts["dropped"], name) for name, counts in totals["rules"].items() if counts["dropped"]),
            reverse=True,
        )
        totals["error"] = (
            f"filter: the rules dropped all {documents['input']} documents under {config.input_path} "
            f"({', '.join(f'{name}: {dropped}' for dropped, name in by_rule)}); an empty output would only "
            f"fail later steps -- see dropped_samples in {join(config.output_path, 'stats.json')} and loosen "
            "the rules in a new step version"
        )
    write_stats(config.output_path, totals)
    if "error" in totals:
        raise DataError(totals["error"])
