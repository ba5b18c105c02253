"""What the console shows of a plan: cached steps beyond `CACHED_ROWS_LISTED` on one line."""

from __future__ import annotations

from executor import Executor, ExecutorStep, this_output_path, versioned
from executor.plan import CACHED_ROWS_LISTED
from tests.executor.steps_for_tests import WriteConfig, write_value


def _steps(count: int, value: int = 0) -> list[ExecutorStep]:
    return [
        ExecutorStep(
            name=f"many/step-{i:03d}",
            fn=write_value,
            config=WriteConfig(this_output_path(), value=value, key=f"display-{i}", inputs=[]),
        )
        for i in range(count)
    ] + [
        ExecutorStep(
            name="many/versioned",
            fn=write_value,
            config=WriteConfig(this_output_path(), value=versioned(value), key="display-v"),
        )
    ]


def test_many_cached_steps_are_summed_up_on_one_line_and_the_rest_listed(tmp_path):
    prefix = str(tmp_path)
    count = CACHED_ROWS_LISTED + 5
    Executor(prefix, console=False).run(_steps(count))
    new = ExecutorStep(
        name="many/new", fn=write_value, config=WriteConfig(this_output_path(), key="display-n")
    )
    plan = Executor(prefix, console=False).run([*_steps(count), new], dry_run=True)
    lines = plan.format().splitlines()
    assert lines[0] == f"Plan: {count + 2} steps ({count + 1} skip, 1 run)"
    assert lines[1] == (
        f"  skip    {count + 1} steps already succeeded, not listed (many/step-000 ... many/versioned); "
        f"marin ls --prefix {prefix} lists them"
    )
    assert lines[2] == "  run     many/new  no output yet"
    assert lines[3].strip() == f"-> {plan.rows[-1].output_path}"
    assert len(lines) == 4
    # All of them on request, as before.
    full = plan.format(cached_listed=None).splitlines()
    assert len(full) == 1 + 2 * (count + 2)
    assert full[1].startswith("  skip    many/step-000   already succeeded")


def test_up_to_the_limit_every_cached_step_is_listed(tmp_path):
    prefix = str(tmp_path)
    steps = _steps(CACHED_ROWS_LISTED - 1)  # with the versioned step: exactly the limit
    Executor(prefix, console=False).run(steps)
    text = Executor(prefix, console=False).run(steps, dry_run=True).format()
    assert "not listed" not in text
    assert text.count("already succeeded") == CACHED_ROWS_LISTED
    assert text == Executor(prefix, console=False).run(steps, dry_run=True).format(cached_listed=None)


def test_a_cached_step_with_a_warning_is_listed_even_when_the_rest_is_summed_up(tmp_path):
    prefix = str(tmp_path)
    count = CACHED_ROWS_LISTED + 3
    Executor(prefix, console=False).run(_steps(count))
    steps = _steps(count)
    # One step's unversioned value changes: its row keeps its warning in the summary view.
    steps[4] = ExecutorStep(
        name="many/step-004", fn=write_value, config=WriteConfig(this_output_path(), value=7, key="display-4")
    )
    text = Executor(prefix, console=False).run(steps, dry_run=True).format()
    assert f"  skip    {count} steps already succeeded, not listed (many/step-000 ... many/versioned)" in text
    assert "  skip    many/step-004  already succeeded" in text
    assert "WARNING: reusing an output made with other unversioned settings:" in text
    assert "value: 0 -> 7" in text


def test_the_console_of_a_cached_rerun_prints_the_summary_line(tmp_path, capfd):
    prefix = str(tmp_path)
    steps = _steps(CACHED_ROWS_LISTED + 1)
    Executor(prefix).run(steps)
    capfd.readouterr()
    Executor(prefix).run(steps)
    out = capfd.readouterr().out
    assert f"  skip    {CACHED_ROWS_LISTED + 2} steps already succeeded, not listed" in out
    assert "-> " not in out
    # Each planned skip still counts as done (without a line of its own).
    total = CACHED_ROWS_LISTED + 2
    assert f"[{total}/{total} done, 0 running, 0 left] finished in " in out
    assert out.count("\n") == 3  # the plan's two lines and the final count
