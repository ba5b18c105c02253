"""The web browser in real headless Chromium (Debian's package, driven by Playwright).

One browser and one sample tree per module; each test opens pages by clicking links the
way a person would, and checks what is on screen.
"""

from __future__ import annotations

import re

import pytest

from tests.marin import sample_tree


@pytest.fixture(scope="module")
def site(web_server) -> str:
    return web_server.url.rstrip("/")


def test_click_through_experiment_step_file(page, site, web_tree):
    page.goto(site + "/")
    assert page.title().startswith("Experiments")
    experiments = page.locator("table a[href^='/exp/']")
    assert sorted(experiments.all_inner_texts()) == sorted([web_tree.experiment, web_tree.failing_experiment])
    page.get_by_role("link", name=web_tree.experiment, exact=True).click()

    # Experiment page: the DAG picture, one coloured node per step, and the steps table.
    page.wait_for_url(f"{site}/exp/{web_tree.experiment}")
    nodes = page.locator("svg.dag a.node")
    assert nodes.count() == 6
    names = [nodes.nth(i).get_attribute("data-name") for i in range(6)]
    assert sorted(names) == sorted(sample_tree.STEP_NAMES)
    assert {nodes.nth(i).get_attribute("data-status") for i in range(6)} == {"SUCCESS"}
    assert page.locator("svg.dag path.edge").count() == 5  # raw->documents->filtered->dedup->{curve,stamp}
    assert page.locator("svg.dag rect").first.get_attribute("fill") == "#d7f0d8"
    rows = page.locator("table.steps tbody tr")
    assert rows.count() == 6
    assert web_tree.steps["dedup/notes"] in page.locator("table.steps").inner_text()

    # Click the dedup node in the picture -> its step page.
    page.locator("svg.dag a.node[data-name='dedup/notes']").click()
    page.wait_for_url(f"{site}/step/{web_tree.steps['dedup/notes']}")
    assert page.locator("h1").inner_text().startswith("dedup/notes")
    text = page.locator("main").inner_text()
    assert "operations.dedup:deduplicate" in text
    assert '"mode": "exact"' in text  # config
    assert "Version inputs" in text and '"name": "dedup/notes"' in text
    assert page.locator("h2:has-text('Status history') + table").inner_text().count("SUCCESS") == 1
    assert "no lease held" in text
    upstream = page.locator("ul.upstream a")
    assert upstream.all_inner_texts() == ["filtered/notes"]
    assert sorted(page.locator("ul.downstream a").all_inner_texts()) == [
        "analysis/broken",
        "analysis/stamp",
        "checkpoints/curve",
    ]

    # Click a shard in the files table -> the viewer shows its documents.
    page.locator("table.files").get_by_role("link", name="shard-00003.jsonl.gz", exact=True).click()
    page.wait_for_url(re.compile(r".*/file/dedup/notes-[0-9a-f]+/shard-00003\.jsonl\.gz$"))
    docs = page.locator("div.doc")
    assert docs.count() == 2
    assert page.locator(".docid").all_inner_texts() == ["doc-010.txt", "doc-011.txt"]
    assert "Document 10 about topic 0." in docs.first.inner_text()

    # Dependency link up: back to the step, then to filtered/notes.
    page.get_by_role("link", name="dedup/notes").first.click()
    page.locator("ul.upstream a", has_text="filtered/notes").click()
    page.wait_for_url(f"{site}/step/{web_tree.steps['filtered/notes']}")
    assert page.locator("h1").inner_text().startswith("filtered/notes")


def test_failed_steps_are_coloured(page, site, web_tree):
    page.goto(f"{site}/exp/{web_tree.failing_experiment}")
    broken = page.locator("svg.dag a.node[data-name='analysis/broken']")
    after = page.locator("svg.dag a.node[data-name='analysis/after_broken']")
    assert broken.get_attribute("data-status") == "FAILED"
    assert broken.locator("rect").get_attribute("stroke") == "#c62828"
    assert after.get_attribute("data-status") == "DEP_FAILED"
    assert page.locator("table.steps .badge[data-status='FAILED']").count() == 1
    broken.click()
    page.wait_for_url(f"{site}/step/{web_tree.steps['analysis/broken']}")
    assert "this step fails on purpose" in page.locator("pre.log").inner_text()
    history = page.locator("h2:has-text('Status history') + table").inner_text()
    assert "RUNNING" in history and "FAILED" in history


def test_paging_shows_the_next_rows(page, site, web_tree):
    page.goto(f"{site}/file/{web_tree.steps['documents/notes']}/shard-00003.jsonl.gz?limit=2")
    first = page.locator(".docid").all_inner_texts()
    assert first == ["doc-009.txt", "doc-010.txt"]
    assert page.locator("a.prev").count() == 0
    page.locator("a.next").first.click()
    page.wait_for_url(re.compile(r".*offset=2.*"))
    second = page.locator(".docid").all_inner_texts()
    assert second == ["doc-011.txt", "doc-012.txt"]
    assert page.locator("a.next").count() == 0  # the shard has four documents
    page.locator("a.prev").first.click()
    page.wait_for_url(re.compile(r".*offset=0.*"))
    assert page.locator(".docid").all_inner_texts() == first


def test_text_file_and_directory_views(page, site, web_tree):
    page.goto(f"{site}/file/{web_tree.steps['raw/notes']}")
    page.locator("table.listing").get_by_role("link", name="doc-012.txt", exact=True).click()
    assert "$$$ ### !!!" in page.locator("pre.text").inner_text()
    page.goto(f"{site}/file/{web_tree.steps['dedup/notes']}/.dedup_work/removals/shard-00000.npz")
    assert re.fullmatch(r"binary, \d+ bytes", page.locator("p.binary").inner_text())
    page.goto(f"{site}/file/{web_tree.steps['dedup/notes']}/stats.json")
    assert '"documents_removed": 3' in page.locator("pre.json").inner_text()


def test_documents_side_by_side_across_steps(page, site, web_tree):
    page.goto(f"{site}/file/{web_tree.steps['dedup/notes']}/shard-00003.jsonl.gz")
    page.get_by_role("link", name="same documents across steps").click()
    page.wait_for_url(re.compile(r".*/compare/dedup/notes-[0-9a-f]+/shard-00003\.jsonl\.gz$"))
    header = page.locator("table.compare thead th").all_inner_texts()
    assert header == [
        "document",
        "raw/notes (source file)",
        "documents/notes",
        "filtered/notes",
        "dedup/notes",
    ]
    rows = {
        row.locator("td.docid").inner_text(): row.locator("td").all_inner_texts()
        for row in page.locator("table.compare tbody tr").all()
    }
    assert list(rows) == ["doc-009.txt", "doc-010.txt", "doc-011.txt", "doc-012.txt"]
    # doc-012 is junk: the filter drops it. doc-009 copies doc-008: dedup drops it.
    assert "dropped by filtered/notes" in rows["doc-012.txt"][3]
    assert rows["doc-012.txt"][4] == "\u2014"
    assert "$$$ ### !!!" in rows["doc-012.txt"][1]  # the raw source file
    assert "Document 8 about topic 3." in rows["doc-009.txt"][3]
    assert "dropped by dedup/notes" in rows["doc-009.txt"][4]
    assert "Document 10 about topic 0." in rows["doc-010.txt"][4]
    assert page.locator("table.compare td.dropped").count() == 2


def test_training_curves_and_results(page, site, web_tree):
    page.goto(f"{site}/step/{web_tree.steps['checkpoints/curve']}")
    page.get_by_role("link", name=re.compile("Training curves")).click()
    page.wait_for_url(f"{site}/train/{web_tree.steps['checkpoints/curve']}")
    loss = page.locator("svg.chart[aria-label='Loss']")
    assert loss.locator("polyline[data-key='train/loss']").get_attribute("data-points") == "30"
    assert loss.locator("polyline[data-key='eval/loss']").get_attribute("data-points") == "3"
    box = loss.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 150  # drawn, visible
    points = loss.locator("polyline[data-key='train/loss']").get_attribute("points").split()
    ys = [float(point.split(",")[1]) for point in points]
    assert ys[-1] > ys[0]  # the loss falls: lower on screen means a larger y coordinate
    results = page.locator("table.results").inner_text()
    assert "bits_per_byte" in results and "1.23" in results
    metrics = page.locator("table.metrics").inner_text()
    assert "train/loss" in metrics and "eval/loss" in metrics


def test_all_steps_page(page, site, web_tree):
    page.goto(site + "/")
    page.get_by_role("link", name="All steps", exact=True).click()
    listed = page.locator("main table tbody tr td:first-child a").all_inner_texts()
    for relpath in web_tree.steps.values():
        assert relpath in listed
    assert page.locator("main .badge[data-status='FAILED']").count() == 1
