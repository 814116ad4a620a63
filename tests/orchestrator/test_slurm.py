"""SLURM for real: a one-node cluster on 127.0.0.1 (munged, slurmctld and slurmd as this test's own
processes, with their own key, state folders and ports) runs `examples/cluster/slurm/orchestrator.sbatch`
as a user submits it. A job is SIGKILLed mid-study, as SLURM does KillWait seconds after a job's limit;
the next job is cut by its own 3-minute limit (warning signal, stop at the trials' last checkpoints,
requeue) and its requeued run finishes the study (its limit lengthened by the test once it has requeued, as
a lab's limits are hours), with the numbers of an uninterrupted run. 4.3 minutes on 2 cores (2026-11-25)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.study.journal import Journal
from tests.services import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "cluster" / "slurm" / "orchestrator.sbatch"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "srun")
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    any(shutil.which(d) is None and not Path("/usr/sbin", d).exists() for d in DAEMONS),
    reason="SLURM and munge are not installed (Debian: apt-get install slurm-wlm munge)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd launches jobs as root")]


def command(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class Slurm:
    """A one-node SLURM cluster: the node is this machine as slurmd sees it (its CPUs), plus one GPU
    that is /dev/null, so `--gres=gpu:1` is granted and its mapping onto Ray's GPUs can be checked.
    Every process it starts, and every process of its jobs, carries its SLURM_CONF in its environment:
    that is how `stop` finds them, by pid."""

    def __init__(self, folder: Path):
        self.folder = folder
        # munged wants its socket's folder open to all, and Unix socket paths stay within 107 bytes
        self.run_dir = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        self.run_dir.chmod(0o755)
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def start(self) -> Slurm:
        key = self.run_dir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        socket_path = self.run_dir / "munge.socket"
        self.daemon(command("munged"), "--foreground", f"--socket={socket_path}", f"--key-file={key}",
                    f"--pid-file={self.run_dir / 'munged.pid'}", f"--log-file={self.folder / 'munged.log'}",
                    f"--seed-file={self.run_dir / 'munged.seed'}")
        self.wait_for(lambda: socket_path.exists(), "munged's socket")
        node = subprocess.run([command("slurmd"), "-C"], capture_output=True, text=True, check=True,
                              env={**self.env, "SLURM_CONF": "/nonexistent"}).stdout.splitlines()[0]
        self.node = node.split()[0].removeprefix("NodeName=")
        self.cpus = int(re.search(r"CPUs=(\d+)", node)[1])
        for folder in ("state", "spool"):
            (self.folder / folder).mkdir()
        (self.folder / "plugstack.conf").write_text("")
        (self.folder / "gres.conf").write_text("Name=gpu File=/dev/null\n")
        self.conf.write_text(f"""ClusterName=orchestrator-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire + 1 s before it starts again (120 s by default)
AuthInfo=socket={socket_path},cred_expire=5
StateSaveLocation={self.folder / 'state'}
SlurmdSpoolDir={self.folder / 'spool'}
SlurmctldPidFile={self.folder / 'slurmctld.pid'}
SlurmdPidFile={self.folder / 'slurmd.pid'}
SlurmctldLogFile={self.folder / 'slurmctld.log'}
SlurmdLogFile={self.folder / 'slurmd.log'}
PlugStackConfig={self.folder / 'plugstack.conf'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=30
OverTimeLimit=0
GresTypes=gpu
{node} NodeAddr=127.0.0.1 Gres=gpu:1 State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        self.daemon(command("slurmctld"), "-D")
        self.wait_for(lambda: self.scontrol("ping").returncode == 0, "slurmctld")
        self.daemon(command("slurmd"), "-D")
        self.wait_for(lambda: self.tool("sinfo", "-h", "-o", "%T").stdout.strip() == "idle", "an idle node")
        return self

    def daemon(self, *args: str) -> None:
        log = open(self.folder / f"{Path(args[0]).name}.out", "w")  # noqa: SIM115 (the daemon writes it)
        self.daemons.append(subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True))

    def wait_for(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for process in self.daemons:
                assert process.poll() is None, f"{process.args[0]} exited; see {self.folder}"
            assert time.monotonic() < deadline, f"{what} not there after {timeout:g} s; see {self.folder}"
            time.sleep(0.5)

    def tool(self, name: str, *args: str, env: dict | None = None, cwd: Path | None = None):
        return subprocess.run([command(name), *args], capture_output=True, text=True, timeout=60,
                              env={**(env or self.env), "SLURM_CONF": str(self.conf)}, cwd=cwd)

    def scontrol(self, *args: str):
        return self.tool("scontrol", *args)

    def sbatch(self, *args: str, env: dict, cwd: Path) -> str:
        out = self.tool("sbatch", "--parsable", *args, env=env, cwd=cwd)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        text = self.scontrol("show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_until_ended(self, job_id: str, timeout: float) -> dict[str, str]:
        ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
        deadline = time.monotonic() + timeout
        while (job := self.job(job_id)).get("JobState") not in ended:
            assert time.monotonic() < deadline, f"job {job_id} still {job.get('JobState')} after {timeout:g} s"
            time.sleep(1)
        return job

    def own_processes(self) -> list[int]:
        """Every process whose environment names this cluster's SLURM_CONF: the daemons, slurmstepd,
        the jobs' scripts, Ray and the orchestrator."""
        return processes_with(f"SLURM_CONF={self.conf}")

    def stop(self) -> None:
        for job_id in self.tool("squeue", "-h", "-o", "%i").stdout.split():
            self.tool("scancel", "--full", "--signal=KILL", job_id)
            self.tool("scancel", job_id)
        for process in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for pid in [*(p.pid for p in self.daemons), *self.own_processes()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in self.daemons:
            process.wait()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def processes_with(variable: str) -> list[int]:
    """The processes whose environment holds `variable` (NAME=value), by pid."""
    marker, found = b"\0" + variable.encode() + b"\0", []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if marker in b"\0" + (entry / "environ").read_bytes():
                    found.append(int(entry.name))
    return found


def gone(variable: str, timeout: float = 30) -> bool:
    """Have all processes holding `variable` ended (within `timeout`)?"""
    deadline = time.monotonic() + timeout
    while processes_with(variable) and time.monotonic() < deadline:
        time.sleep(0.5)
    return not processes_with(variable)


def described(variable: str) -> str:
    """The processes holding `variable`, pid and command line each (for a failing assertion's message)."""
    lines = []
    for pid in processes_with(variable):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {command[:200]}")
    return "\n".join(lines)


def with_descendants(pids: set[int]) -> set[int]:
    """`pids` and every living descendant of one (psutil walks /proc)."""
    found = set(pids)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    return found


def kill_all(*variables: str, timeout: float = 30) -> set[int]:
    """SIGKILL every process holding one of `variables` and every descendant of one, as a cgroup's kill
    reaches every process of a job: all are stopped first (SIGSTOP, again until no new one appears: a
    stopped process forks no more), then killed. A pass over the environments alone is not enough: Ray's
    agents (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) rewrite their process title over the start of
    their environment, so /proc shows them without SLURM_JOB_ID, and SLURM's proctrack/linuxproc, which
    the test cluster uses, loses them once their parent is dead. The pids."""
    stopped: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = with_descendants({pid for variable in variables for pid in processes_with(variable)} | stopped)
        if not (new := members - stopped - {os.getpid()}):
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return stopped


@pytest.fixture()
def slurm(tmp_path):
    folder = tmp_path / "slurm"
    folder.mkdir()
    cluster = Slurm(folder)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


STUDY_S = 200  # the study (s of training, as calibrated): longer than two 3-minute runs train before their
# warnings (each 60-90 s after its start, of which 10 s (quiet) to 40 s (loaded) go to starting Ray, doctor and
# the trials; at 70 s a quiet machine finished the study 3 s before the first warning, and nothing was cut)


def epoch_seconds(model: str, data_dir: Path, folder: Path) -> float:
    """One epoch of one trial on this machine (a fresh Python trains 3 epochs on one thread, as a trial does)."""
    config = {"task": "stsb", "model": model, "data_dir": str(data_dir), "epochs": 3, "batch_size": 8,
              "max_seq_length": 32, "num_threads": 1, "cache_dir": str(folder), "device": "cpu", "layer": 2,
              "seed": 0, "score_test": False, "export_model": False}
    code = ("import json, sys, time\nfrom trainables.kinds import get_kind\nticks = []\n"
            "get_kind('finetune').run(json.loads(sys.argv[1]), lambda m, checkpoint_dir=None: "
            "ticks.append(time.perf_counter()))\nprint((ticks[-1] - ticks[0]) / (len(ticks) - 1))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(config)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


def epochs_for(seconds: float, epoch_s: float, slots: int) -> int:
    """Epochs that make the study's 4 trials last about `seconds` on `slots` CPUs: a faster machine
    gets more epochs, so a job's first run cannot finish the study before its warning."""
    return max(16, round(seconds / (epoch_s * -(-4 // min(4, slots)))))


def write_study(folder: Path, model: str, data_dir: Path, epochs: int) -> Path:
    """Two layers x two seeds, one CPU a trial: 4 trials of short epochs, a checkpoint each."""
    folder.mkdir(parents=True, exist_ok=True)
    study = {"name": "slurm", "trainable": "finetune", "task": "stsb", "model": model,
             "ablate": {"layer": [1, 2]}, "replicate": {"seeds": [0, 1]},
             "train": {"epochs": epochs, "batch_size": 8, "max_seq_length": 32},
             "data_dir": str(data_dir), "resources": {"cpu": 1},
             "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}, "report": {"baseline": {"layer": 2}}}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def trials(folder: Path) -> dict[str, object]:
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("slurm")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return client, [r for r in runs if "mlflow.parentRunId" in r.data.tags], \
        [r for r in runs if r.data.tags.get("orchestrator.role") == "study"]


def events(journal: Journal, kind: str) -> list[dict]:
    return [e for e in journal.events() if e["event"] == kind]


@pytest.mark.alone  # its study must outlast a 3-minute job's warning: other tests' load moves that
def test_a_study_sigkilled_then_cut_by_its_time_limit_twice_finishes_like_an_uninterrupted_run(
        slurm, tiny_bert, synthetic_data_dir, tmp_path):
    started = time.monotonic()
    epoch_s = epoch_seconds(tiny_bert, synthetic_data_dir, tmp_path / "calibration")
    epochs = epochs_for(STUDY_S, epoch_s, slurm.cpus)
    reference = tmp_path / "reference"
    local = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    done = subprocess.run([str(BIN / "orchestrator"), "launch", str(write_study(reference, tiny_bert,
                                                                                synthetic_data_dir, epochs)),
                           "--storage", str(reference / "studies")], cwd=reference, env=local, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    reference_s = time.monotonic() - started

    work = tmp_path / "lab"
    study = write_study(work, tiny_bert, synthetic_data_dir, epochs)
    ray_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths stay within 107 bytes
    env = {**os.environ, "ORCHESTRATOR": str(BIN / "orchestrator"), "ORCHESTRATOR_STORAGE": str(work / "studies"),
           "RAY_TMPDIR": str(ray_dir), "RAY_PORT": str(free_port()), "HF_HUB_OFFLINE": "1"}
    resources = ["--nodes=1", f"--cpus-per-task={slurm.cpus}", "--gres=gpu:1", f"--chdir={work}"]
    journal = Journal(work / "studies" / "slurm" / "journal.jsonl")
    try:
        # 1. a job SIGKILLed mid-trial, without warning (as SLURM does KillWait seconds after a limit, or the
        # OOM killer, or a node dying): nothing gets to stop cleanly
        first = slurm.sbatch(*resources, "--time=10", str(SCRIPT), str(study), env=env, cwd=work)
        deadline = time.monotonic() + 300
        while len(events(journal, "checkpoint")) < 2:
            assert slurm.job(first)["JobState"] in ("PENDING", "RUNNING"), (work / f"ablation-{first}.out").read_text()
            assert time.monotonic() < deadline, "no checkpoints after 300 s"
            time.sleep(0.5)
        # every process of the job at once (`scancel --signal=KILL` would cancel it: SIGTERM first, then KILL)
        victims = kill_all(f"SLURM_JOB_ID={first}")
        assert len(victims) >= 4  # the script, the launch, srun, Ray's processes
        assert slurm.wait_until_ended(first, 120)["JobState"] in ("FAILED", "CANCELLED")
        killed_log = (work / f"ablation-{first}.out").read_text()
        assert "ray cluster: 1 node(s) alive, " + f"{slurm.cpus} CPUs, 1 GPUs" in killed_log  # --gres=gpu:1: 1 GPU
        assert not events(journal, "finished"), "the kill came too late to interrupt trials"
        _, children, _ = trials(work)
        assert "RUNNING" in {c.info.status for c in children}  # what a SIGKILL leaves behind
        assert gone(f"RAY_TMPDIR={ray_dir}"), \
            f"processes outside the killed job hold its Ray folder:\n{described(f'RAY_TMPDIR={ray_dir}')}"

        # 2. the next job: warned 90-120 s before its 3-minute limit (SLURM checks limits every 30 s), it stops
        # at the trials' last checkpoints and requeues itself; its next run, with the same limit, is cut again
        # mid-study (trials interrupted twice, a resume of a resume) and requeues itself once more
        second = slurm.sbatch(*resources, "--time=3", "--signal=B:TERM@90", str(SCRIPT), str(study), env=env,
                              cwd=work)
        deadline = time.monotonic() + 600
        while int((job := slurm.job(second)).get("Restarts", 0)) < 2:
            assert job.get("JobState") in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING"), \
                (work / f"ablation-{second}.out").read_text()[-5000:]
            assert time.monotonic() < deadline, f"not requeued twice after 600 s: {job}"
            time.sleep(1)
        # its third run resumes the study; its limit lengthened (as a lab's hours are), so that run finishes it
        updated = slurm.scontrol("update", f"JobId={second}", "TimeLimit=10")
        assert updated.returncode == 0, updated.stderr
        job = slurm.wait_until_ended(second, 600)
        log = (work / f"ablation-{second}.out").read_text()
        assert job["JobState"] == "COMPLETED", log[-5000:]
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    print(f"{epochs} epochs ({epoch_s:.2f} s each); calibration and reference run {reference_s:.0f} s; SLURM jobs "
          f"{time.monotonic() - started - reference_s:.0f} s")

    first, rest = log.split("run 2,", 1)
    runs = [first, *rest.split("run 3,", 1)]
    assert int(job["Restarts"]) == 2 and len(runs) == 3 and "run 4," not in log, log[-5000:]
    for cut in runs[:2]:
        assert "time limit near: stopping the study" in cut and "slurm: not finished" in cut
        assert re.search(r"study slurm stopped \(\d+ checkpoints and finished trials in this run\); requeued", cut)
    assert "slurm: resuming 4 planned trials" in runs[1] and "study slurm finished" in runs[2]
    assert gone(f"RAY_TMPDIR={ray_dir}"), \
        f"the job left processes behind (Ray not stopped):\n{described(f'RAY_TMPDIR={ray_dir}')}"

    records = journal.records()
    assert len(records) == 4 and all(r.outcome.value == "completed" for r in records.values())
    assert Counter(e["key"] for e in events(journal, "finished")) == {key: 1 for key in records}
    client, children, parents = trials(work)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(c.data.tags["orchestrator.trial_key"] for c in children) == sorted(records)  # each once
    assert not [c for c in children if c.info.status != "FINISHED"]  # nothing left RUNNING
    for run in children:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "dev_spearman")]
        assert sorted(steps) == list(range(1, epochs + 1))  # every epoch logged once

    _, uninterrupted, _ = trials(reference)
    by_key = {c.data.tags["orchestrator.trial_key"]: c.data.metrics for c in uninterrupted}
    for run in children:
        theirs = by_key[run.data.tags["orchestrator.trial_key"]]
        for metric in ("best_dev_spearman", "test_spearman", "test_pearson"):
            assert run.data.metrics[metric] == pytest.approx(theirs[metric], abs=1e-6), metric
    # every table of scores equal; the compute table and the reproducibility answers (wall times, machines)
    # and report.md, which holds them, differ between any two runs
    ours, theirs = work / "reports" / "slurm", reference / "reports" / "slurm"
    tables = sorted(p.name for p in theirs.glob("*.tex") if p.stem not in {"report", "compute", "reproducibility"})
    assert {"ablation.tex", "headline.tex"} <= set(tables)
    for table in tables:
        assert (ours / table).read_text() == (theirs / table).read_text(), table


def test_kill_all_reaches_descendants_whose_environment_no_longer_shows_the_job(tmp_path):
    """The harness's cgroup-like kill: a process holding the marker, its child started without it (as Ray's
    agents show after rewriting their title) and that child's child are all killed."""
    marker = f"KILL_ALL_TEST={tmp_path.name}"
    tree = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(300)\"]); time.sleep(300)'], env={})\n"
            "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", tree], env={**os.environ, marker.split("=")[0]: tmp_path.name})
    try:
        deadline = time.monotonic() + 30
        while len(family := sorted(with_descendants({parent.pid}))) < 3:
            assert time.monotonic() < deadline, "the tree did not start"
            time.sleep(0.2)
        assert processes_with(marker) == [parent.pid]
        assert kill_all(marker) >= set(family)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while alive := [pid for pid in family if pid != parent.pid and running(pid)]:
            assert time.monotonic() < deadline, f"still running: {alive}"
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            parent.kill()


def running(pid: int) -> bool:
    """Alive and not a zombie (a container's pid 1 may never reap an orphan)."""
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False
