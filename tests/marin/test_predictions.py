"""`marin predictions`, `marin show` and the browser on pre-registered predictions (issue 14).

The tree is written the way the scaling-law steps write theirs: a prediction step
(prediction.json sealed with `operations.scaling_laws.digest_of`), the target training step
that depends on it (preregistration.json, stats.json) and the report step that depends on
both. The whole pipeline, trained for real, is in tests/integration/test_scaling_law.py.
"""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest

from marin.cli import main as marin
from marin.outputs import OutputTree
from marin.predictions import prediction_of, predictions
from marin.web.pages import App
from operations.scaling_laws import digest_of


def one_pixel_png() -> bytes:
    """A valid 1x1 PNG (so a real browser decodes it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


PNG = one_pixel_png()
T_PREDICTED = "2026-11-23T10:00:00.000Z"
T_TRAINED = "2026-11-23T10:05:00.000Z"


def write_step(prefix, name, fn, *, deps=(), events=(("RUNNING", T_PREDICTED), ("SUCCESS", T_PREDICTED))):
    path = os.path.join(prefix, f"{name}-{abs(hash(name)) % 16**8:08x}")
    os.makedirs(path)
    info = {
        "name": name,
        "fn_name": fn,
        "config": {},
        "version": {"name": name, "config": {}},
        "dependencies": list(deps),
        "output_path": path,
    }
    with open(os.path.join(path, ".executor_info"), "w") as handle:
        json.dump(info, handle)
    with open(os.path.join(path, ".executor_status"), "w") as handle:
        handle.writelines(json.dumps({"date": date, "status": status}) + "\n" for status, date in events)
    return path


def write_json(path, name, value):
    with open(os.path.join(path, name), "w") as handle:
        json.dump(value, handle)


def write_prediction(prefix, name="predictions/big", *, loss=3.0, interval=(2.9, 3.1), created=T_PREDICTED):
    path = write_step(prefix, name, "operations.scaling_laws:write_prediction")
    record = {
        "kind": "marin.scaling.prediction",
        "target": {"label": "1e13-d128l4", "flops": 1e13},
        "predicted_loss": loss,
        "interval": list(interval) if interval else None,
        "confidence": 0.9,
        "target_parameters": 123456.0,
        "extrapolation": 10.0,
        "created_at": created,
    }
    record["digest"] = digest_of(record)
    write_json(path, "prediction.json", record)
    return path, record


def write_target(prefix, prediction_path, digest, *, loss, started=T_TRAINED, status="SUCCESS"):
    events = [("RUNNING", started)] + ([(status, started)] if status != "RUNNING" else [])
    path = write_step(
        prefix,
        "checkpoints/big",
        "operations.scaling_laws:train_preregistered",
        deps=[prediction_path, os.path.join(prefix, "tokenized/data-1a2b3c4d")],
        events=events,
    )
    write_json(path, "preregistration.json", {"prediction_digest": digest, "training_started_at": started})
    if status == "SUCCESS":
        write_json(path, "stats.json", {"final_eval_loss": loss})
    return path


def write_report(prefix, prediction_path, target_path, actual):
    path = write_step(
        prefix,
        "analysis/prediction/big",
        "operations.scaling_laws:report_prediction",
        deps=[prediction_path, target_path],
    )
    write_json(path, "report.json", {"actual_loss": actual})
    with open(os.path.join(path, "prediction.png"), "wb") as handle:
        handle.write(PNG)
    return path


@pytest.fixture
def complete(tmp_path):
    """A prediction, its target (loss 3.05: inside [2.9, 3.1]) and its report."""
    prefix = str(tmp_path / "tree")
    prediction, record = write_prediction(prefix)
    target = write_target(prefix, prediction, record["digest"], loss=3.05)
    report = write_report(prefix, prediction, target, 3.05)
    return prefix, prediction, target, report


def only(prefix):
    (found,) = predictions(OutputTree(prefix))
    return found


def test_a_prediction_is_found_with_its_target_report_and_outcome(complete):
    prefix, prediction, target, report = complete
    p = only(prefix)
    assert (p.step.path, p.target.path, p.report.path) == (prediction, target, report)
    assert (p.predicted_loss, p.interval, p.actual_loss) == (3.0, (2.9, 3.1), 3.05)
    assert p.relative_error == pytest.approx(0.05 / 3.0)
    assert (p.verdict, p.intact, p.preregistered) == ("inside", True, True)
    # the same prediction is what a target's or a report's page shows
    tree = OutputTree(prefix)
    for path in (prediction, target, report):
        assert prediction_of(tree, tree.by_path[path]).step.path == prediction


def test_other_steps_have_no_prediction(complete, tmp_path):
    prefix = complete[0]
    other = write_step(prefix, "checkpoints/plain", "operations.train:train", deps=[complete[1]])
    tree = OutputTree(prefix)
    assert prediction_of(tree, tree.by_path[other]) is None


def test_an_outcome_outside_the_interval_is_called_so(tmp_path):
    prefix = str(tmp_path / "tree")
    prediction, record = write_prediction(prefix)
    target = write_target(prefix, prediction, record["digest"], loss=3.2)
    assert only(prefix).verdict == "outside" and only(prefix).actual_loss == 3.2  # from stats.json: no report
    write_report(prefix, prediction, target, 3.2)
    assert only(prefix).verdict == "outside"


def test_an_edited_prediction_shows_as_edited_and_not_preregistered(complete):
    prefix, prediction, _, _ = complete
    path = os.path.join(prediction, "prediction.json")
    with open(path) as handle:
        record = json.load(handle)
    record["predicted_loss"] = 3.05  # moved onto the outcome after the fact
    write_json(prediction, "prediction.json", record)
    p = only(prefix)
    assert (p.intact, p.verdict, p.preregistered) == (False, "EDITED", False)


def test_a_prediction_written_after_training_started_is_not_preregistered(tmp_path):
    prefix = str(tmp_path / "tree")
    prediction, record = write_prediction(prefix, created="2026-11-23T11:00:00.000Z")
    write_target(prefix, prediction, record["digest"], loss=3.0)
    p = only(prefix)
    assert p.preceded_training is False and p.preregistered is False and p.verdict == "inside"


def test_a_target_that_recorded_another_digest_is_not_preregistered(tmp_path):
    prefix = str(tmp_path / "tree")
    prediction, _ = write_prediction(prefix)
    write_target(prefix, prediction, "0" * 64, loss=3.0)
    assert only(prefix).preregistered is False


def test_a_prediction_without_target_waits(tmp_path):
    prefix = str(tmp_path / "tree")
    write_prediction(prefix)
    p = only(prefix)
    assert (p.target, p.verdict, p.preregistered, p.actual_loss) == (
        None,
        "waiting for the target",
        None,
        None,
    )
    prediction, record = write_prediction(str(tmp_path / "running"))
    write_target(str(tmp_path / "running"), prediction, record["digest"], loss=None, status="RUNNING")
    p = only(str(tmp_path / "running"))
    assert p.verdict == "waiting for the target" and p.preregistered is True  # checkable once it started


def test_garbage_in_the_tree_is_reported_not_raised(tmp_path):
    prefix = str(tmp_path / "tree")
    prediction, _ = write_prediction(prefix)
    with open(os.path.join(prediction, "prediction.json"), "w") as handle:
        handle.write("[1, 2")
    p = only(prefix)
    assert p.problem and p.verdict == "not read" and p.intact is None
    with open(os.path.join(prediction, "prediction.json"), "w") as handle:
        json.dump({"predicted_loss": "3.0", "interval": ["a", 1], "created_at": 5}, handle)
    p = only(prefix)
    assert (p.predicted_loss, p.interval, p.created_at, p.intact) == (None, None, None, False)


def test_marin_predictions_prints_and_filters(complete, capsys):
    prefix = complete[0]
    assert marin(["predictions", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert "1e13-d128l4" in out and "3.0000" in out and "[2.9000, 3.1000]" in out and "+1.67%" in out
    assert "inside" in out and "yes" in out
    assert marin(["predictions", "--prefix", prefix, "nothing-like-this"]) == 0
    assert "no predictions matching 'nothing-like-this'" in capsys.readouterr().out
    assert marin(["predictions", "--prefix", prefix, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["verdict"], row["preregistered"], row["actual_loss"]) == ("inside", True, 3.05)
    assert marin(["predictions", "--prefix", prefix, "["]) == 2


def test_marin_show_of_the_target_shows_its_prediction(complete, capsys):
    prefix, _, target, _ = complete
    assert marin(["show", "--prefix", prefix, target]) == 0
    out = capsys.readouterr().out
    assert "prediction:  1e13-d128l4: final eval loss 3.0000, 90% interval [2.9000, 3.1000]" in out
    assert "outcome:   3.0500 (+1.67% from the prediction), inside the interval" in out
    assert "pre-registered: yes" in out
    assert marin(["show", "--prefix", prefix, target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prediction"]["verdict"] == "inside"


def test_the_browser_lists_predictions_and_shows_one_on_each_step_page(complete):
    prefix, prediction, target, report = complete
    app = App(prefix)
    listing = app.handle("/predictions").body.decode()
    assert "1e13-d128l4" in listing and 'data-verdict="inside"' in listing and 'class="actual"' in listing
    assert 'href="/predictions"' in listing  # in the header of every page
    rel = os.path.relpath(target, prefix)
    page = app.handle(f"/step/{rel}").body.decode()
    assert "<h2>Prediction</h2>" in page and 'data-verdict="inside"' in page
    assert f'src="/raw/{os.path.relpath(report, prefix)}/prediction.png"' in page
    png = app.handle(f"/raw/{os.path.relpath(report, prefix)}/prediction.png")
    assert png.content_type == "image/png" and b"".join(png.stream()) == PNG
    assert app.handle("/predictions?q=%5B").status == 400


def test_a_file_named_png_that_is_not_one_is_not_served_as_an_image(complete):
    prefix, _, _, report = complete
    with open(os.path.join(report, "fake.png"), "wb") as handle:
        handle.write(b"<svg onload=alert(1)>" + b"\x00" * 16)
    raw = App(prefix).handle(f"/raw/{os.path.relpath(report, prefix)}/fake.png")
    assert raw.content_type == "application/octet-stream"


def test_each_prediction_finds_its_own_target_through_the_recorded_inputs(complete):
    prefix, big, target, _ = complete
    write_prediction(prefix, "predictions/small", loss=4.0)
    small = {p.step.name: p for p in predictions(OutputTree(prefix))}
    assert small["predictions/small"].target is None and small["predictions/small"].report is None
    assert small["predictions/big"].target.path == target


def test_a_real_browser_shows_the_prediction_and_the_report_plot(complete, page):
    from marin.web import start_server

    prefix, prediction, target, _ = complete
    server = start_server(prefix, port=0).start_in_thread()
    try:
        site = server.url.rstrip("/")
        page.goto(site + "/")
        page.get_by_role("link", name="Predictions", exact=True).click()
        page.wait_for_url(site + "/predictions")
        row = page.locator("table.predictions tbody tr")
        assert row.count() == 1 and "inside" in row.inner_text()
        assert page.locator("svg.interval-chart circle.actual").get_attribute("fill") == "#2e7d32"
        page.get_by_role("link", name=os.path.relpath(prediction, prefix), exact=True).click()
        assert page.locator("h2", has_text="Prediction").count() == 1
        page.get_by_role("link", name=os.path.relpath(target, prefix), exact=True).first.click()
        page.wait_for_url(f"{site}/step/{os.path.relpath(target, prefix)}")
        plot = page.locator("img.plot")
        plot.wait_for()
        # the plot loaded under the page's Content-Security-Policy and decoded as an image
        assert page.evaluate("document.querySelector('img.plot').complete")
        assert plot.evaluate("img => img.naturalWidth") == 1
    finally:
        server.shutdown()


# -- a tampered tree (found by a red-team pass): odd numbers are taken as unread ----------------
HUGE = 10**400
"""What json.loads reads from 400 digits: an int no float can hold (math.isfinite raises)."""


@pytest.mark.parametrize(
    "field",
    [
        "predicted_loss",
        "interval",
        "confidence",
        "extrapolation",
        "target_parameters",
        "flops",
        "actual_loss",
        "final_eval_loss",
    ],
)
def test_a_number_too_large_for_a_float_is_no_number(tmp_path, capsys, field):
    prefix = str(tmp_path / "tree")
    prediction, record = write_prediction(prefix)
    if field == "interval":
        record["interval"] = [2.9, HUGE]
    elif field == "flops":
        record["target"]["flops"] = HUGE
    elif field in record:
        record[field] = HUGE
    record["digest"] = digest_of(record)  # sealed as written: only the number is odd
    write_json(prediction, "prediction.json", record)
    target = write_target(
        prefix, prediction, record["digest"], loss=HUGE if field == "final_eval_loss" else 3.05
    )
    if field != "final_eval_loss":  # the target's stats.json is read only when no report says
        write_report(prefix, prediction, target, HUGE if field == "actual_loss" else 3.05)

    p = only(prefix)
    read = {
        "interval": p.interval,
        "flops": p.target_flops,
        "actual_loss": p.actual_loss,
        "final_eval_loss": p.actual_loss,
    }.get(field, getattr(p, field, None))
    assert p.intact is True
    if field == "actual_loss":  # the report's number is no number: the target's stats.json is read
        assert read == 3.05
    else:
        assert read is None
    for command in (
        ["predictions"],
        ["predictions", "--json"],
        ["show", "predictions/big"],
        ["show", "predictions/big", "--json"],
        ["show", target],
    ):
        assert marin([*command, "--prefix", prefix]) == 0, command
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err and "predictions/big-" in captured.out


def test_an_error_that_overflows_a_float_is_not_reported(tmp_path, capsys):
    # Both losses are finite floats; their difference is not (JSON has no Infinity).
    prefix = str(tmp_path / "tree")
    prediction, record = write_prediction(prefix, loss=-1e308, interval=None)
    write_target(prefix, prediction, record["digest"], loss=1e308)

    assert only(prefix).relative_error is None
    assert marin(["predictions", "--prefix", prefix, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(name))
    assert (row["actual_loss"], row["relative_error"]) == (1e308, None)
    assert marin(["predictions", "--prefix", prefix]) == 0
    assert marin(["show", "predictions/big", "--prefix", prefix]) == 0


def test_many_predictions_and_a_step_of_many_inputs_are_read_in_one_pass(tmp_path, monkeypatch):
    """Each prediction's target and report used to be found by reading every step's inputs
    again: 200 predictions and one step of 60,000 inputs (a 2.8 MB tree) took the
    predictions page 5 s of CPU. The inputs are now read once, whatever the count."""
    from marin.outputs import StepOutput

    prefix = str(tmp_path / "tree")
    made = [write_prediction(prefix, f"predictions/p{i:02d}")[0] for i in range(20)]
    write_step(
        prefix,
        "analysis/everything",
        "operations.scaling_laws:report_prediction",
        deps=[f"{prefix}/elsewhere/x-{i:08x}" for i in range(5000)] + [made[3]],
    )
    reads: list[str] = []
    real = StepOutput.dependencies

    def counted(step):
        reads.append(step.name)
        return real.fget(step)

    monkeypatch.setattr(StepOutput, "dependencies", property(counted))
    found = predictions(OutputTree(prefix))
    assert len(found) == 20
    assert reads == ["analysis/everything"]  # the one step of that kind: read once, not 20 times
    assert [p.step.path for p in found if p.report is not None] == [made[3]]


def test_a_label_of_a_million_characters_is_cut_in_the_cli_too(tmp_path, capsys):
    """prediction.json may hold 1 MiB: `marin predictions` and `marin show` printed the label
    whole (the browser already cut it)."""
    prefix = str(tmp_path / "tree")
    path, record = write_prediction(prefix)
    record["target"]["label"] = "L" * 1_000_000
    write_json(path, "prediction.json", record)
    assert marin(["predictions", "--prefix", prefix]) == 0
    out = capsys.readouterr().out
    assert "(1,000,000 characters)" in out and len(out) < 5_000
    assert marin(["show", "--prefix", prefix, "predictions/big"]) == 0
    out = capsys.readouterr().out
    assert "(1,000,000 characters)" in out and "L" * 201 not in out
