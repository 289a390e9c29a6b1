"""A job that trained exits 0 however the user's script ends, and an exception exits 1 with that exception, never
a signal. Each ending of tests/python/ending_job.py is repeated: 20 jobs of 2 ranks, every rank forked from a warm
runner and ending through the interpreter's own exit (a failure in 10% of exits shows with probability
1 - 0.9^40 > 98%); the tutorial's ending again with both cores busy; Lightning's and Accelerate's ends (10 jobs
each, 2.x); whole jobs under torch.multiprocessing spawn (10) and fork (20), torchrun (10, 2.x: Debian's 1.13
torchrun does not start under Python 3.11) and mpirun (10).

The failure these guard against: a gloo thread that needs the GIL (to drop a comm hook's callback, or what that
callback held) after the interpreter began to shut down is ended inside a C++ destructor, and the process aborts
("terminate called without an active exception"); docs/torch-design.md, "Why a job ends cleanly". Before the
fix, 10 of 40 ranks of the tutorial's ending aborted here."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness import free_port  # one helper for the tests and ending_job.py

JOB = Path(__file__).with_name("ending_job.py")
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
ENDINGS = ["destroy_last", "drop_then_destroy", "no_destroy", "global", "exception"]


def run(cmd, folder, env=None, timeout=900):
    """Runs a command (a hang guard, not a timing: jobs take seconds); its output."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(JOB.parent), full.get("PYTHONPATH")]))
    return subprocess.run(cmd, cwd=folder, env=full, capture_output=True, text=True, timeout=timeout)


def exits_of(out):
    """Every rank's exit code, from the forked runner's "exits:" lines."""
    return [int(c) for line in out.splitlines() if line.startswith("exits:") for c in line.split()[1:]]


def what_went_wrong(folder, codes, expected):
    """The logs of the ranks that did not exit as expected (their last lines), for the failure message."""
    logs = sorted(Path(folder).glob("*.log"))
    bad = [log for log, code in zip(logs, codes) if code != expected]
    return "\n".join(f"--- {log.name}:\n" + "\n".join(log.read_text().splitlines()[-40:]) for log in bad[:3])


def assert_forked_jobs_exit(tmp_path, jobs, ending, framework="torch", world=2):
    result = run([sys.executable, str(JOB), "forked", str(jobs), str(world), ending, framework, str(tmp_path)],
                 tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    codes = exits_of(result.stdout)
    assert len(codes) == jobs * world, result.stdout + result.stderr
    expected = 1 if ending == "exception" else 0
    wrong = [c for c in codes if c != expected]
    assert not wrong, (f"{len(wrong)} of {len(codes)} ranks exited {sorted(set(wrong))} (-6 is SIGABRT), not "
                       f"{expected}:\n" + what_went_wrong(tmp_path, codes, expected))
    if ending == "exception":  # each rank ended with the user's exception, printed
        logs = [p.read_text() for p in tmp_path.glob("*.log")]
        assert all("UserError: the user's error at the last step" in log for log in logs), logs[0][-2000:]
    assert not any("terminate called" in p.read_text() for p in tmp_path.glob("*.log"))


@pytest.mark.parametrize("ending", ENDINGS)
def test_every_ending_of_a_plain_loop_exits_cleanly(tmp_path, ending):
    assert_forked_jobs_exit(tmp_path, 20, ending)


def test_endings_with_both_cores_busy(tmp_path):
    """The tutorial's ending again while two processes spin on the two cores (the gloo threads then get the GIL
    and the CPU later, which is when the race at exit was most often lost)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        assert_forked_jobs_exit(tmp_path, 20, "destroy_last")
    finally:
        for h in hogs:
            h.kill()
            h.wait()


@pytest.mark.parametrize("framework,ending", [
    ("lightning", "no_destroy"), ("lightning", "exception"), ("accelerate", "destroy_last"),
    ("accelerate", "exception")])
def test_framework_endings_exit_cleanly(tmp_path, framework, ending):
    """Trainer.fit returning as the script's end (or raising from training_step); the end of an Accelerate loop
    with its process group destroyed (or raising). 10 jobs of 2 ranks each: ~3.5 s a job."""
    pytest.importorskip({"lightning": "lightning.pytorch", "accelerate": "accelerate"}[framework])
    assert_forked_jobs_exit(tmp_path, 10, ending, framework)


def assert_launched_jobs_exit(tmp_path, cmd, jobs, env=None):
    """``jobs`` jobs of a launcher: each exits 0, and no rank printed an abort."""
    failed = []
    for job in range(jobs):
        folder = tmp_path / f"job{job}"
        folder.mkdir()
        result = run(cmd(folder), folder, env)
        if result.returncode != 0 or "terminate called" in result.stderr + result.stdout:
            failed.append(f"job {job}: exit {result.returncode}:\n{(result.stdout + result.stderr)[-5000:]}")
    assert not failed, f"{len(failed)} of {jobs} jobs failed; the first:\n{failed[0]}"


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_torch_multiprocessing_jobs_exit_cleanly(tmp_path, method):
    """torch.multiprocessing.start_processes as in PyTorch's DDP tutorial (the shape the failure was found in),
    the jobs started one after the other from one parent."""
    jobs = 10 if method == "spawn" else 20  # a spawned rank imports torch (and torch._dynamo) again: ~4 s a job
    result = run([sys.executable, str(JOB), method, str(jobs), "2", "destroy_last", str(tmp_path)], tmp_path)
    outcomes = [line[5:] for line in result.stdout.splitlines() if line.startswith("job: ")]
    assert result.returncode == 0 and len(outcomes) == jobs, result.stdout + result.stderr[-3000:]
    failed = [o for o in outcomes if o != "ok"]
    assert not failed, f"{len(failed)} of {jobs} jobs failed: {failed[:3]}\n{result.stderr[-3000:]}"
    assert "terminate called" not in result.stderr, result.stderr[-3000:]


def test_torchrun_jobs_exit_cleanly(tmp_path):
    if not TORCH2:
        pytest.skip("Debian's PyTorch 1.13 torchrun fails under Python 3.11 before any rank starts "
                    "(torch.distributed.elastic: 'NoneType' object has no attribute 'get')")
    assert_launched_jobs_exit(  # --nproc_per_node: the spelling 1.13 knows too
        tmp_path, lambda f: [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(JOB), "env", "destroy_last"], 10)


def test_mpirun_jobs_exit_cleanly(tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (scripts/setup.sh installs Open MPI)")

    def cmd(folder):
        return [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "PYTHONPATH", "-x",
                f"MASTER_PORT={free_port()}", sys.executable, str(JOB), "env", "no_destroy"]
    assert_launched_jobs_exit(tmp_path, cmd, 10)


