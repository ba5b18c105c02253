"""marin.web.safety, rule by rule: each test pins one check, so changing it fails a test.

Most important: the prefix guard compares whole path components, so `/data/out2` (or a
symlink into it) is NOT inside the prefix `/data/out` -- a plain `startswith` would let
the browser serve a sibling directory whose name merely starts with the prefix's name.
"""

from __future__ import annotations

import os

import pytest

from executor.store import open_store
from marin.web.safety import PrefixGuard, Refused, Target, check_relpath, check_segment, decode_path


@pytest.fixture
def tree(tmp_path):
    """`<tmp>/out` (the prefix, with a file) and its sibling `<tmp>/out2` (a secret)."""
    prefix = tmp_path / "out"
    (prefix / "step-1234").mkdir(parents=True)
    (prefix / "step-1234" / "data.txt").write_text("inside")
    sibling = tmp_path / "out2"
    sibling.mkdir()
    (sibling / "secret.txt").write_text("outside")
    return prefix, sibling


def guard_for(prefix) -> PrefixGuard:
    return PrefixGuard(str(prefix), open_store(str(prefix)))


# -- the prefix guard ------------------------------------------------------------------------


def test_a_sibling_directory_sharing_the_prefix_name_is_outside(tree):
    prefix, sibling = tree
    guard = guard_for(prefix)
    root = os.path.realpath(prefix)
    assert guard.inside(root)
    assert guard.inside(os.path.join(root, "step-1234"))
    assert not guard.inside(os.path.realpath(sibling))
    assert not guard.inside(os.path.join(os.path.realpath(sibling), "secret.txt"))
    assert not guard.inside(os.path.dirname(root))


def test_a_symlink_into_the_sibling_directory_is_refused(tree):
    prefix, sibling = tree
    os.symlink(sibling, prefix / "step-1234" / "escape")
    guard = guard_for(prefix)
    with pytest.raises(Refused) as refused:
        guard.resolve("step-1234/escape/secret.txt")
    assert refused.value.status == 403
    assert refused.value.message == "refused: the path leads outside the prefix"


def test_a_symlinked_file_pointing_into_the_sibling_is_refused(tree):
    prefix, sibling = tree
    os.symlink(sibling / "secret.txt", prefix / "step-1234" / "link.txt")
    with pytest.raises(Refused):
        guard_for(prefix).resolve("step-1234/link.txt")


def test_a_symlink_that_stays_inside_is_followed(tree):
    prefix, _ = tree
    os.symlink(prefix / "step-1234", prefix / "alias")
    target = guard_for(prefix).resolve("alias/data.txt")
    assert target == Target(
        relpath="alias/data.txt",
        path=f"{prefix}/alias/data.txt",
        local=os.path.join(os.path.realpath(prefix), "step-1234", "data.txt"),
    )


def test_resolving_plain_paths(tree):
    prefix, _ = tree
    guard = guard_for(prefix)
    root = os.path.realpath(prefix)
    assert guard.resolve("") == Target("", str(prefix), root)
    assert guard.resolve("/step-1234/") == Target(
        "step-1234", f"{prefix}/step-1234", os.path.join(root, "step-1234")
    )
    assert guard.resolve("step-1234/data.txt").local == os.path.join(root, "step-1234", "data.txt")
    # A missing path resolves to where it would be (reading it then fails with "not found").
    assert guard.resolve("step-1234/missing/deeper.txt").local == os.path.join(
        root, "step-1234", "missing", "deeper.txt"
    )
    # The second resolution of the same directories gives the same answer.
    assert guard.resolve("step-1234/data.txt").local == os.path.join(root, "step-1234", "data.txt")


def test_resolving_under_a_file_is_not_found_not_an_error(tree):
    prefix, _ = tree
    target = guard_for(prefix).resolve("step-1234/data.txt/below")
    assert target.local == os.path.join(os.path.realpath(prefix), "step-1234", "data.txt", "below")


def test_a_prefix_reached_through_a_symlink_is_resolved_once(tree, tmp_path):
    prefix, sibling = tree
    os.symlink(prefix, tmp_path / "via-link")
    guard = guard_for(tmp_path / "via-link")
    assert guard.local_root == os.path.realpath(prefix)
    assert guard.resolve("step-1234/data.txt").local == os.path.join(
        os.path.realpath(prefix), "step-1234", "data.txt"
    )
    assert not guard.inside(os.path.realpath(sibling))


def test_remote_prefixes_have_no_local_path():
    guard = PrefixGuard("memory://bucket/out", open_store("memory://bucket/out"))
    assert guard.local_root is None
    assert guard.resolve("a/b") == Target("a/b", "memory://bucket/out/a/b", None)
    assert guard.resolve("") == Target("", "memory://bucket/out", None)
    with pytest.raises(Refused):
        guard.resolve("a/../b")


def test_recorded_paths_are_followed_only_under_the_prefix(tree):
    prefix, sibling = tree
    guard = guard_for(prefix)
    assert guard.resolve_recorded(f"{prefix}/step-1234/data.txt").relpath == "step-1234/data.txt"
    assert guard.resolve_recorded(f"{sibling}/secret.txt") is None  # /…/out2 starts with /…/out
    assert guard.resolve_recorded(str(prefix)) is None
    assert guard.resolve_recorded(f"{prefix}/step-1234/../../out2/secret.txt") is None
    assert guard.resolve_recorded(None) is None
    assert guard.resolve_recorded(42) is None


# -- request paths ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "segments"),
    [
        ("/", [""]),
        ("/a", ["a"]),
        ("/a/b/", ["a", "b"]),
        ("/a/", ["a"]),
        ("/a%20b/c%C3%A9", ["a b", "cé"]),
        ("/tokenized/stdlib-1234/train", ["tokenized", "stdlib-1234", "train"]),
    ],
)
def test_request_paths_decode_once_into_segments(raw, segments):
    assert decode_path(raw) == segments


NOT_FOUND = "not found"
NOT_UTF8 = "not found: the path is not UTF-8"
EMPTY = "refused: empty path segment"
DOTS = "refused: '.' and '..' are not allowed in paths"
ENCODED = "refused: encoded characters left after decoding"
BACKSLASH = "refused: backslash in path"
CONTROL = "refused: control character in path"


@pytest.mark.parametrize(
    ("raw", "status", "message"),
    [
        ("relative", 404, NOT_FOUND),
        ("", 404, NOT_FOUND),
        ("/a/%FF", 404, NOT_UTF8),
        ("//a", 403, EMPTY),
        ("/a//b", 403, EMPTY),
        ("/a/../b", 403, DOTS),
        ("/a/%2e%2e/b", 403, DOTS),
        ("/./a", 403, DOTS),
        ("/a/%252e%252e", 403, ENCODED),
        ("/a%5cb", 403, BACKSLASH),
        ("/a%00b", 403, CONTROL),
        ("/a%0ab", 403, CONTROL),
        ("/a%7f", 403, CONTROL),
        ("/a/b//", 403, EMPTY),
    ],
)
def test_bad_request_paths_are_refused_with_the_reason(raw, status, message):
    with pytest.raises(Refused) as refused:
        decode_path(raw)
    assert refused.value.status == status
    assert refused.value.message == message
    assert str(refused.value) == message


def test_a_prefix_at_the_filesystem_root_contains_everything():
    guard = PrefixGuard("/", open_store("/"))
    assert guard.local_root == "/"
    assert guard.inside("/etc") and guard.inside("/")


@pytest.mark.parametrize("segment", ["a", "a b", "é", "x.y", "..a", "a..", ".hidden", "~", "a-b_c"])
def test_ordinary_segments_pass(segment):
    check_segment(segment)


def test_an_empty_segment_is_allowed_only_when_asked():
    check_segment("", allow_empty=True)
    with pytest.raises(Refused, match="empty"):
        check_segment("")


@pytest.mark.parametrize(
    ("relpath", "expected"),
    [
        ("", ""),
        ("/", ""),
        ("a", "a"),
        ("/a/b/", "a/b"),
        ("XdirX/", "XdirX"),
        ("step-1/sub dir/f.txt", "step-1/sub dir/f.txt"),
    ],
)
def test_relative_paths_are_stripped_and_checked(relpath, expected):
    assert check_relpath(relpath) == expected


@pytest.mark.parametrize("relpath", ["a//b", "a/../b", "a/./b", "..", "a\\b", "a/%41"])
def test_bad_relative_paths_are_refused(relpath):
    with pytest.raises(Refused):
        check_relpath(relpath)


def test_on_an_object_store_no_local_path_counts_as_inside():
    guard = PrefixGuard("memory://bucket/out", open_store("memory://bucket/out"))
    assert not guard.inside("/etc/passwd") and not guard.inside("")
