"""Interrupting a run leaves none of the local backend's temporary files behind.

A heavy step's process gets its payload and writes its result through `marin-step-*` files
in the system's temporary directory. The driver interrupted (Ctrl-C, SIGTERM) while such a
step runs used to leave the empty result file there, one per interrupted run.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import os, time
    from dataclasses import dataclass
    from executor import ExecutorStep, ResourceConfig, executor_main, this_output_path, versioned

    @dataclass(frozen=True)
    class Config:
        name: str
        output_path: str

    def sleeps(config: Config) -> None:
        with open(os.environ["STEP_STARTED"], "w") as handle:
            handle.write("started")
        time.sleep(120)

    if __name__ == "__main__":
        executor_main(
            steps=[
                ExecutorStep(
                    name="s/heavy",
                    fn=sleeps,
                    config=Config(versioned("a"), this_output_path()),
                    resources=ResourceConfig.with_cpu(cpu=1),
                )
            ]
        )
    """
)


def leftovers(temp) -> list[str]:
    return sorted(name for name in os.listdir(temp) if name.startswith("marin-step-"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_heavy_step_leaves_no_temporary_files(tmp_path, signum):
    temp = tmp_path / "tmp"
    temp.mkdir()
    started = tmp_path / "started"
    script = tmp_path / "experiment.py"
    script.write_text(SCRIPT)
    env = {key: value for key, value in os.environ.items() if key != "MARIN_PREFIX"}
    env.update(PYTHONPATH=REPO, TMPDIR=str(temp), STEP_STARTED=str(started))
    process = subprocess.Popen(
        [sys.executable, str(script), "--prefix", str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: started.exists() or process.poll() is not None, timeout=60)
        assert process.poll() is None, process.communicate()
        assert leftovers(temp), "the step's result file should exist while it runs"
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, (out, err)
    assert err.decode().strip().splitlines()[-1] == "error: interrupted"
    assert leftovers(temp) == []
