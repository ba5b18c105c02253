"""Real headless Chromium for the web browser tests, driven through Playwright.

Playwright's own browser download is never used (the machines reach only package
registries): the tests drive Debian's `chromium` package at /usr/bin/chromium. On a
fresh machine the session fixture installs it with apt-get (as root), so the README's
test command is enough; if it cannot be installed the tests fail with the reason, they
are not skipped.

`build_web_tree(root)` makes the tree the browser tests read: the sample experiment
(tests/marin/sample_tree.py), a second experiment with a FAILED and a DEP_FAILED step,
a secret file *next to* the prefix, and symlinks inside the prefix that point at it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from executor import Executor, ExecutorRunError, ExecutorStep, this_output_path
from tests.marin import sample_tree

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
INSTALL_TIMEOUT_S = 900


def ensure_chromium() -> str:
    """Path of a working Chromium; installs Debian's package when it is missing."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install Debian's chromium package")
    if os.geteuid() != 0:
        pytest.fail(
            f"{CHROMIUM} is missing; install it as root: "
            "apt-get update && apt-get install -y --no-install-recommends chromium"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", "chromium"],
    ):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"installing chromium: {' '.join(command)} took over {INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            pytest.fail(
                f"installing chromium failed: {' '.join(command)} exited {done.returncode}:\n"
                f"{(done.stdout + done.stderr)[-3000:]}"
            )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"apt-get installed chromium but {CHROMIUM} is still missing")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium_path() -> str:
    return ensure_chromium()


@pytest.fixture(scope="module")
def browser(chromium_path):
    """One headless Chromium per test module (launching costs about a second)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=chromium_path, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def page(browser):
    """A fresh page (own context: no cookies or cache shared between tests)."""
    context = browser.new_context()
    context.set_default_timeout(15_000)
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


@dataclass(frozen=True)
class BrokenConfig:
    input_path: str
    """The deduplicated documents."""

    output_path: str


def broken_step(config: BrokenConfig) -> None:
    raise RuntimeError("this step fails on purpose")


def after_broken(config: BrokenConfig) -> None:
    os.makedirs(config.output_path, exist_ok=True)


@dataclass(frozen=True)
class WebTree:
    prefix: str
    secret: str
    """Content of a file outside the prefix; no response may ever contain it."""

    secret_path: str
    steps: dict[str, str]
    """Step name -> output path relative to the prefix."""

    experiment: str
    """Id of the sample experiment (all SUCCESS)."""

    failing_experiment: str


def build_web_tree(root: str) -> WebTree:
    prefix = os.path.join(root, "prefix")
    sample = sample_tree.build_steps()
    sample_tree.run(prefix)
    dedup = sample[3]
    broken = ExecutorStep(
        name="analysis/broken",
        fn=broken_step,
        config=BrokenConfig(input_path=dedup, output_path=this_output_path()),
    )
    downstream = ExecutorStep(
        name="analysis/after_broken",
        fn=after_broken,
        config=BrokenConfig(input_path=broken, output_path=this_output_path()),
    )
    try:
        Executor(prefix, lease_config=sample_tree.FAST_LEASES, console=False).run([*sample, downstream])
    except ExecutorRunError:
        pass
    else:
        raise AssertionError("analysis/broken was meant to fail")
    manifests = sorted(os.listdir(os.path.join(prefix, "experiments")))
    by_size = {}
    for manifest in manifests:
        with open(os.path.join(prefix, "experiments", manifest)) as handle:
            by_size[len(json.load(handle)["steps"])] = manifest.removesuffix(".json")
    steps = {}
    for dirpath, _dirs, names in os.walk(prefix):
        if ".executor_info" in names:
            with open(os.path.join(dirpath, ".executor_info")) as handle:
                steps[json.load(handle)["name"]] = os.path.relpath(dirpath, prefix)
    # The secret sits next to the prefix; symlinks inside the prefix lead to it.
    secret = "TOP-SECRET-" + os.urandom(8).hex()
    secret_path = os.path.join(root, "secret.txt")
    with open(secret_path, "w") as handle:
        handle.write(secret + "\n")
    with open(os.path.join(root, "secret.json"), "w") as handle:
        json.dump({"name": secret, "config": {"secret": secret}}, handle)
    dedup_dir = os.path.join(prefix, steps["dedup/notes"])
    os.symlink(secret_path, os.path.join(dedup_dir, "leak.txt"))
    os.symlink(root, os.path.join(dedup_dir, "up"))
    os.symlink(os.path.join(dedup_dir, "stats.json"), os.path.join(dedup_dir, "alias.json"))  # stays inside
    # A fake step whose bookkeeping files are symlinks out of the prefix.
    fake = os.path.join(prefix, "evil", "bookkeeping-0123abcd")
    os.makedirs(fake)
    os.symlink(os.path.join(root, "secret.json"), os.path.join(fake, ".executor_info"))
    os.symlink(secret_path, os.path.join(fake, ".executor_status"))
    # A real-looking step whose log is a symlink out of the prefix.
    logleak = os.path.join(prefix, "evil", "logleak-4567abcd")
    os.makedirs(logleak)
    with open(os.path.join(prefix, steps["raw/notes"], ".executor_info")) as handle:
        info = json.load(handle)
    info.update(name="evil/logleak", output_path=logleak, dependencies=[])
    with open(os.path.join(logleak, ".executor_info"), "w") as handle:
        json.dump(info, handle)
    shutil.copy(os.path.join(prefix, steps["raw/notes"], ".executor_status"), logleak)
    os.symlink(secret_path, os.path.join(logleak, ".executor_log"))
    os.symlink(secret_path, os.path.join(logleak, ".executor_status.lock"))
    steps["evil/logleak"] = os.path.relpath(logleak, prefix)
    return WebTree(
        prefix=prefix,
        secret=secret,
        secret_path=secret_path,
        steps=steps,
        experiment=by_size[6],
        failing_experiment=by_size[8],
    )


@pytest.fixture(scope="module")
def web_tree(tmp_path_factory) -> WebTree:
    """The browser tests' tree, built once per test module."""
    return build_web_tree(str(tmp_path_factory.mktemp("web")))


@pytest.fixture(scope="module")
def web_server(web_tree):
    """`marin browse` on `web_tree`, on a free port, for one test module."""
    from marin.web import start_server

    server = start_server(web_tree.prefix, port=0).start_in_thread()
    try:
        yield server
    finally:
        server.shutdown()
