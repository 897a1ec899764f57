"""A throw-away one-node Slurm cluster for tests (used by tests/test_slurm.py; docs/slurm.md).

munged, slurmctld and slurmd run in the foreground as child processes of the test, with their state,
logs, sockets and config under one base directory and on free ports, so the fixture owns every PID
and a leftover cluster of an earlier run cannot interfere.  ``stop`` cancels jobs first (stopping
slurmd leaves running steps alive), then TERMs each daemon, waits, and KILLs what is left.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

SBIN = Path("/usr/sbin")
CONF = """ClusterName=pytest
FirstJobId={first_job}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={b}/run/munge.sock
StateSaveLocation={b}/state/ctld
SlurmdSpoolDir={b}/state/d
SlurmctldPidFile={b}/run/slurmctld.pid
SlurmdPidFile={b}/run/slurmd.pid
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/filetxt
JobCompLoc={b}/log/jobcomp.txt
MpiDefault=pmi2
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def ensure_installed(timeout: float = 300) -> str | None:
    """Installs slurm-wlm and munge with apt when slurmctld is absent; returns a reason to skip, or None."""
    if (SBIN / "slurmctld").exists() and (SBIN / "munged").exists():
        return None if os.geteuid() == 0 else "slurmd must run as root here (SlurmdUser=root)"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "Slurm is not installed and cannot be installed here (needs root and apt-get)"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm", "munge"]):
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd)} did not finish within {timeout}s"
        if p.returncode != 0:
            return f"{' '.join(cmd)} failed (rc {p.returncode}): {p.stderr.strip()[-300:]}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``with Cluster(base) as c: c.run(["sbatch", ...])``; ``c.env`` has SLURM_CONF for clients."""

    def __init__(self, base: Path, cpus: int = 16):
        self.b, self.cpus = Path(base), cpus
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.b / "etc" / "slurm.conf"))

    def __enter__(self) -> "Cluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, cmd: list[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=kw.pop("env", self.env), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, **kw)

    def _spawn(self, cmd: list[str], log: str) -> None:
        fh = open(self.b / "log" / log, "ab")
        self.procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=self.env))
        fh.close()

    def start(self, timeout: float = 30) -> None:
        b = self.b
        for d in ("etc", "run", "log", "state/ctld", "state/d", "munge"):
            (b / d).mkdir(parents=True, exist_ok=True)
        (b / "munge").chmod(0o700)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn([str(SBIN / "munged"), "-F", "--force", f"--socket={b}/run/munge.sock",
                     f"--key-file={key}", f"--log-file={b}/log/munged.log",
                     f"--pid-file={b}/run/munged.pid", f"--seed-file={b}/munge/munged.seed"], "munged.out")
        self._wait(lambda: (b / "run" / "munge.sock").exists(), timeout, "munged socket")
        # A fresh job id range per cluster: MPICH names its shared-memory segments after the PMI
        # job id ("<job>.<step>"), and a segment left in /dev/shm by an aborted job of an earlier
        # throw-away cluster with the same id makes the next MPI_Init under srun hang.
        first_job = int.from_bytes(os.urandom(3), "big") + 1000
        conf = CONF.format(b=b, host=socket.gethostname().split(".")[0], cpus=self.cpus,
                           ctld_port=free_port(), d_port=free_port(), first_job=first_job)
        (b / "etc" / "slurm.conf").write_text(conf)
        self._spawn([str(SBIN / "slurmctld"), "-D", "-c", "-f", self.env["SLURM_CONF"]], "slurmctld.out")
        self._spawn([str(SBIN / "slurmd"), "-D", "-f", self.env["SLURM_CONF"]], "slurmd.out")
        self._wait(lambda: self.run(["sinfo", "-h", "-N", "-o", "%t"], 10).stdout.strip() == "idle",
                   timeout, "node idle")

    def _wait(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while waiting for {what}:\n{self.logs()}")
            try:
                if ok():
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"Slurm: {what} not reached within {timeout}s:\n{self.logs()}")

    def logs(self, tail: int = 2000) -> str:
        out = []
        for f in sorted((self.b / "log").glob("*")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Cancels every job, then TERM / wait / KILL each daemon (slurmd first)."""
        if self.procs and all(p.poll() is None for p in self.procs[1:]):
            try:
                self.run(["scancel", "--full", "-u", "root"], 10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline \
                        and self.run(["squeue", "-h", "-o", "%i"], 10).stdout.strip():
                    time.sleep(0.3)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        self.procs.clear()


if __name__ == "__main__":          # `make slurm-ready` (make test runs it beside the installs)
    why = ensure_installed()
    print(f"slurm for tests/test_slurm.py: {why or 'installed'}")
