"""`marin reproduce` of a heavy step (one with `resources`) defined in the experiment script.

The script is loaded under a module name of its own in `marin reproduce`'s process; the step
runs in another process (the local backend's), which must get the script's function and
config type all the same, as a plain run of the script sends them.
"""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import os
    from dataclasses import dataclass
    from executor import ExecutorStep, ResourceConfig, executor_main, this_output_path, versioned

    @dataclass(frozen=True)
    class Config:
        output_path: str
        words: int = 3

    def count(config: Config) -> None:
        os.makedirs(config.output_path, exist_ok=True)
        with open(os.path.join(config.output_path, "count.txt"), "w") as handle:
            handle.write(" ".join(str(i) for i in range(config.words)))

    step = ExecutorStep(
        name="study/heavy",
        fn=count,
        config=Config(this_output_path(), versioned(5)),
        resources=ResourceConfig.with_cpu(),
    )

    if __name__ == "__main__":
        executor_main([step])
    """
)


def run(command: list[str], cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_reproduce_a_heavy_step_defined_in_the_experiment_script(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "heavy.py").write_text(SCRIPT)
    env = {key: value for key, value in os.environ.items() if key not in ("MARIN_PREFIX", "MARIN_BACKEND")}
    env.update(
        PYTHONPATH=REPO,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    for command in (
        ["git", "init", "-q"],
        ["git", "add", "heavy.py"],
        ["git", "-c", "commit.gpgsign=false", "commit", "-q", "-m", "study"],
    ):
        assert run(command, repo, env).returncode == 0, command
    first = run([sys.executable, "heavy.py", "--prefix", "../out"], repo, env)
    assert first.returncode == 0, first.stdout + first.stderr

    marin = os.path.join(os.path.dirname(sys.executable), "marin")
    again = run([marin, "reproduce", "study/heavy", "--prefix", "../out", "--into", "../again"], repo, env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "study/heavy: __main__:count (its function)" in again.stdout
    assert "result: outputs are identical" in again.stdout
    (output,) = [name for name in os.listdir(tmp_path / "again" / "study") if name.startswith("heavy-")]
    assert (tmp_path / "again" / "study" / output / "count.txt").read_text() == "0 1 2 3 4"
