"""An emulated cluster on one machine: MPI over real TCP through rate-limited virtual NICs.

    python benchmarks/netcluster.py up N --rate 1gbit [--server-rate R] [--ranks-per-node K]
    python benchmarks/netcluster.py run [--json FILE] [--timeout S] -- COMMAND ...
    python benchmarks/netcluster.py run --nodes N --rate R [...] -- COMMAND ...   # up, run, down
    python benchmarks/netcluster.py status
    python benchmarks/netcluster.py down

Node k (``node0`` .. ``nodeN-1``) is a network namespace ``PREFIX-nK`` whose only interface ``eth0``
(address 169.254.77.(k+1)/24, link-local, inside the namespace only) is one end of a veth pair; the
other end, ``PREFIX-vK``, is a port of the bridge ``PREFIX-br`` in the root namespace, which has no
address, so the nodes reach each other and nothing else.  A ``tbf`` qdisc on ``eth0`` limits what the
node sends and one on ``PREFIX-vK`` what it receives, so a node's NIC is limited both ways; node0 (rank
0: the parameter server of easgd/asgd) may get another rate.  The kernel has no ``netem`` here:
bandwidth is limited, latency is not emulated.  The cluster's settings live in the bridge's alias, so
``run`` and ``down`` need no state file.

``run`` starts ONE ``mpiexec`` on node0 (in its namespace, hostname ``node0``) with K ranks per node;
the launcher starts its daemon on every other node through ``netcluster_agent.sh``, its "ssh", so
the MPI library sees N hosts as on a real cluster: shared memory inside a node, the network between
nodes -- with the settings that make it use TCP on ``eth0`` (MPICH: ``MPIR_CVAR_CH4_NETMOD=ofi
FI_PROVIDER=tcp``; Open MPI: its TCP BTL).  Afterwards it reports per node the bytes its interface
sent and received (the qdiscs' counters): the proof that the traffic crossed the emulated links,
since a launch that quietly used shared memory looks the same otherwise.

From Python (tests): ``with NetCluster(2, rate="200mbit") as c: res = c.run([...], capture=True)``;
the context manager tears everything down on an error, Ctrl-C or SIGTERM.  Needs root and iproute2.
"""
from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

try:
    from scalesgd.comm import shm                 # standard library only
except ModuleNotFoundError as exc:                # the one import error a user can fix by a command
    if exc.name != "scalesgd":
        raise
    raise SystemExit("netcluster: the scalesgd package does not import: run it with the project's "
                     ".venv/bin/python (pip install -e .) or with PYTHONPATH=src") from None

DEFAULT_PREFIX = "sgdnet"
SUBNET = "169.254.77"             # node k is SUBNET.(k+1)/24; link-local, never outside the namespaces
NODE_IF = "eth0"
MAX_NODES = 64
PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,7}\Z")           # + "-v63" stays within IFNAMSIZ (15)
RATE_RE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)\Z")
UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
LATENCY = "50ms"                  # tbf queue: what may wait before being dropped
QUIET_BYTES = 64 * 1024           # less than this sent in total: the job did not use the links
CLEAN = "python benchmarks/netcluster.py down"

# Both MPI families launch as on a real cluster: mpiexec runs on node0 and starts its per-node
# daemon (MPICH: hydra_pmi_proxy, Open MPI: prted) on every node through its ssh launcher, whose
# "ssh" is AGENT (it enters the node's namespace); daemons and ranks connect over eth0.  So each
# library knows which ranks share a node (shared memory inside a node, the network between nodes).
# A single local launcher for every node would not do: MPICH then treats all ranks as one node
# (MPIR_CVAR_NOLOCAL=1 forces the network, also inside a node), and Open MPI's ranks cannot reach
# its PMIx server on 127.0.0.1 (another loopback in each namespace).
AGENT = Path(__file__).resolve().with_name("netcluster_agent.sh")
# MPICH: the ofi network module over TCP on eth0.  Its default, UCX, found a shared-memory path
# between the namespaces (same kernel): no bytes on the interfaces.
MPICH_ARGS = ["-launcher", "ssh", "-launcher-exec", str(AGENT), "-iface", NODE_IF]
MPICH_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": NODE_IF}
# Open MPI: pml ob1 with the TCP BTL on eth0 between nodes, its sm BTL inside a node
OPENMPI_ARGS = ["--prtemca", "plm_ssh_agent", str(AGENT), "--prtemca", "plm_ssh_no_tree_spawn", "1",
                "--prtemca", "oob_tcp_if_include", NODE_IF, "--bind-to", "none", "--oversubscribe",
                "--mca", "pml", "ob1", "--mca", "btl", "tcp,sm,self", "--mca", "btl_tcp_if_include", NODE_IF]
OPENMPI_ENV = {"OMPI_MCA_osc": "^ucx"}      # the UCX one-sided component only warns, then declines


class NetClusterError(Exception):
    """A one-line error for the user (missing tool, leftovers, bad argument, failed command)."""


def parse_rate(text: str) -> int:
    """'1gbit', '200mbit', '2.5gbit' -> bits per second (tc's units, decimal)."""
    m = RATE_RE.match(str(text).strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise NetClusterError(f"bad rate {text!r}: give a number and bit, kbit, mbit, gbit or tbit, "
                              "e.g. 1gbit or 200mbit")
    return int(float(m.group(1)) * UNITS[m.group(2)])


def format_rate(bits: int) -> str:
    """Bits per second in tc's largest exact unit: 1000000000 -> '1gbit', 2500000000 -> '2500mbit'."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % UNITS[unit] == 0:
            return f"{bits // UNITS[unit]}{unit}"
    return f"{bits}bit"


def requirements_missing() -> str | None:
    """None if this machine can host a cluster, else one line saying what is missing.  The kernel
    probe runs in an anonymous network namespace that vanishes with the probe: nothing is left."""
    if os.geteuid() != 0:
        return "netcluster: needs root (network namespaces, veth pairs and tc qdiscs)"
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"netcluster: needs '{tool}' ({pkg}) on PATH"
    probe = ("ip link add name x0 type veth peer name x1 && ip link add name b0 type bridge && "
             "tc qdisc add dev x0 root tbf rate 1mbit burst 32kb latency 50ms")
    p = subprocess.run(["unshare", "--net", "sh", "-c", probe], capture_output=True, text=True)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["failed"])[-1]
        return f"netcluster: this kernel cannot host the cluster (namespaces, veth, bridge, tbf): {why}"
    return None


def _cmd(argv: list[str], check: bool = True) -> str:
    """Runs an ip/tc command; a failure is a NetClusterError naming the command and its message."""
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise NetClusterError(f"'{shlex.join(argv)}' failed: {why}")
    return p.stdout


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise NetClusterError(f"bad prefix {prefix!r}: 1-8 lower-case letters or digits, starting "
                              "with a letter")
    return prefix


# ---- what exists under a prefix, and removing it ---------------------------------------------

def _namespaces(prefix: str) -> list[str]:
    names = [ln.split()[0] for ln in _cmd(["ip", "netns", "list"]).splitlines() if ln.strip()]
    return sorted(n for n in names if n.startswith(f"{prefix}-"))


def _links(prefix: str) -> list[str]:
    """Links of the root namespace named PREFIX-* ('name@peer' in ip's output loses the '@peer')."""
    rows = json.loads(_cmd(["ip", "-j", "link", "show"]) or "[]")
    return sorted(r["ifname"] for r in rows if r["ifname"].startswith(f"{prefix}-"))


def _holder_of(pid: int) -> str | None:
    """'PID:START:PIDNS' for a running process (START: its start time in clock ticks since boot,
    so a reused PID is another holder; PIDNS: the PID namespace the number means something in);
    None when it has ended, a zombie not yet reaped included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else f"{pid}:{fields[19]}:{pidns}"


def _bridge_alias(prefix: str) -> str | None:
    rows = json.loads(_cmd(["ip", "-j", "-d", "link", "show"]) or "[]")
    return next((r.get("ifalias", "") for r in rows if r["ifname"] == f"{prefix}-br"), None)


def holder_state(prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
    """Who holds the cluster under ``prefix``: ("alive", who) while the process whose `with` made
    it runs; ("ended", who) once it has ended without its teardown (killed); ("none", why) when no
    holder is recorded (a cluster left up on purpose by ``up``, or made by a version that recorded
    none) or there is no bridge; ("unknown", why) when it cannot be told (a holder in another PID
    namespace, or a record that does not parse)."""
    alias = _bridge_alias(check_prefix(prefix))
    kv = dict(item.split("=", 1) for item in (alias or "").split()[1:] if "=" in item)
    if "holder" not in kv:
        return "none", "no holder recorded" if alias is not None else "no bridge"
    parts = kv["holder"].split(":")
    if len(parts) != 3 or not parts[0].isdigit():
        return "unknown", f"a holder record that does not parse ({kv['holder']!r})"
    if str(os.stat("/proc/self/ns/pid").st_ino) != parts[2]:
        return "unknown", f"pid {parts[0]} of another PID namespace"
    return ("alive" if _holder_of(int(parts[0])) == kv["holder"] else "ended"), f"pid {parts[0]}"


@contextlib.contextmanager
def _prefix_lock(prefix: str):
    """An exclusive lock per prefix, across processes (flock), held from the look at what exists to
    the end of building: two that find the same leftovers cannot both remove them and rebuild, nor
    can the one that loses tear down what the other built."""
    import fcntl  # noqa: PLC0415 - Linux only, like the rest of this tool
    folder = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))
    with open(folder / f"netcluster-{check_prefix(prefix)}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def reclaim(prefix: str) -> list[str]:
    """For a prefix that is the caller's own (a test's): removes what exists under it unless a
    process holds it that runs or cannot be told ended (then NetClusterError naming it), and
    returns what it removed.  What a killed run left, with or without a recorded holder, would
    otherwise refuse every later run."""
    with _prefix_lock(prefix):
        if not leftovers(prefix):
            return []
        state, who = holder_state(prefix)
        if state == "alive":
            raise NetClusterError(f"cluster '{prefix}' is in use by {who}, which still runs")
        if state == "unknown":
            raise NetClusterError(f"cluster '{prefix}' is held by {who}: not removed")
        return teardown(prefix)


def leftovers(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Everything of a cluster with this prefix that still exists, e.g. ['netns sgdnet-n0', ...]."""
    return [f"netns {n}" for n in _namespaces(prefix)] + [f"link {n}" for n in _links(prefix)]


def _kill_inside(ns: str) -> int:
    """SIGKILLs every process in namespace ``ns`` (only ours: we created it) and unlinks the MPI
    segments in /dev/shm they mapped (a killed rank never reaches MPI_Finalize, which would; an
    unlinked segment stays valid for whoever still maps it).  Returns how many processes."""
    pids = [int(p) for p in _cmd(["ip", "netns", "pids", ns], check=False).split()]
    segments = {path for pid in pids for path in shm.mapped_files(pid) if shm.is_mpi_segment(path)}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for path in segments:
        with contextlib.suppress(OSError):
            path.unlink()
    deadline = time.monotonic() + 5.0        # a loaded machine takes a moment to tear them down:
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:   # until then they
        time.sleep(0.02)                     # still map segments that a later cleanup must not skip
    return len(pids)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie maps nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextlib.contextmanager
def _signals_deferred():
    """SIGINT/SIGTERM wait until the block ends (delivered then), so a second Ctrl-C cannot cut a
    teardown in half."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def teardown(prefix: str = DEFAULT_PREFIX, wait: float = 10.0) -> list[str]:
    """Removes every namespace and link named PREFIX-*, killing processes left inside; returns what
    it removed.  Deleting a namespace is asynchronous in the kernel, so it waits until all is gone."""
    check_prefix(prefix)
    found = leftovers(prefix)
    with _signals_deferred():
        for ns in _namespaces(prefix):
            _kill_inside(ns)
        for link in _links(prefix):
            if not link.endswith("-br"):
                _cmd(["ip", "link", "del", link], check=False)     # also removes the peer eth0
        for ns in _namespaces(prefix):
            _cmd(["ip", "netns", "del", ns], check=False)
        _cmd(["ip", "link", "del", f"{prefix}-br"], check=False)
        deadline = time.monotonic() + wait
        while (left := leftovers(prefix)) and time.monotonic() < deadline:
            time.sleep(0.05)
    if left:
        raise NetClusterError(f"could not remove {', '.join(left)}")
    return found


def _qdisc_bytes(dev: str, ns: str | None = None) -> int:
    """Bytes the root qdisc of ``dev`` has sent (``tc -s``), in namespace ``ns`` or the root one."""
    argv = ["tc", "-j", "-s", *(["-n", ns] if ns else []), "qdisc", "show", "dev", dev]
    rows = json.loads(_cmd(argv) or "[]")
    return sum(int(r.get("bytes", 0)) for r in rows if r.get("root"))


@dataclass
class Traffic:
    """Bytes a node's interface sent (tbf on its eth0) and received (tbf on the bridge port)."""
    sent: int
    received: int


@dataclass
class RunResult:
    returncode: int
    stdout: str | None                  # None unless run(capture=True)
    stderr: str | None
    traffic: dict[str, Traffic]         # per node, during this run only
    seconds: float
    timed_out: bool = False


def format_traffic(traffic: dict[str, Traffic], rates: dict[str, int], warn: bool = True) -> str:
    """The per-node report printed after ``run`` (MB = 10^6 bytes)."""
    lines = ["netcluster: bytes over the emulated links during the run (tc qdisc counters):",
             f"  {'node':<8}{'rate':>10}{'sent MB':>12}{'received MB':>14}"]
    for node, t in traffic.items():
        lines.append(f"  {node:<8}{format_rate(rates[node]):>10}{t.sent / 1e6:>12.3f}"
                     f"{t.received / 1e6:>14.3f}")
    total = sum(t.sent for t in traffic.values())
    if warn and total < QUIET_BYTES:
        lines.append(f"netcluster: warning: only {total / 1e3:.0f} kB crossed the links: if the job "
                     "communicated more, the MPI library did not use its network (docs/cluster.md)")
    return "\n".join(lines)


def mpi_flavor(mpiexec: str) -> str:
    """'mpich' or 'openmpi', from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetClusterError(f"cannot run {mpiexec} --version: {exc}") from None
    if "Open MPI" in out or "OpenRTE" in out or "PRRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out:
        return "mpich"
    raise NetClusterError(f"{mpiexec}: neither MPICH's nor Open MPI's mpiexec")


def default_mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    exe = os.environ.get("MPIEXEC") or (str(here) if here.exists() else shutil.which("mpiexec"))
    if not exe:
        raise NetClusterError("no mpiexec: install the [mpi] extra, or pass --mpiexec / set MPIEXEC")
    return exe


class NetCluster:
    """N nodes as network namespaces behind one bridge, each NIC limited by tbf both ways.

    ``up()`` refuses to start while anything of a cluster with the same prefix exists (the error
    names the cleaning command); ``down()`` removes everything.  As a context manager it tears down
    on any exit, an exception, Ctrl-C (KeyboardInterrupt) and SIGTERM (SystemExit) included."""

    def __init__(self, nodes: int, rate: str | int = "1gbit", server_rate: str | int | None = None,
                 ranks_per_node: int = 1, prefix: str = DEFAULT_PREFIX, cpus_per_node: int = 0):
        if not 1 <= int(nodes) <= MAX_NODES:
            raise NetClusterError(f"nodes must be 1..{MAX_NODES}, not {nodes}")
        if int(ranks_per_node) < 1:
            raise NetClusterError(f"ranks per node must be >= 1, not {ranks_per_node}")
        if not 0 <= int(cpus_per_node) <= os.cpu_count():
            raise NetClusterError(f"cpus per node must be 0 (all) .. {os.cpu_count()}, not {cpus_per_node}")
        self.nodes, self.ranks_per_node = int(nodes), int(ranks_per_node)
        self.cpus_per_node = int(cpus_per_node)
        self.prefix = check_prefix(prefix)
        self.rate = rate if isinstance(rate, int) else parse_rate(rate)
        sr = server_rate if server_rate is not None else self.rate
        self.server_rate = sr if isinstance(sr, int) else parse_rate(sr)
        self._old_sigterm = None
        self.holder: str | None = None      # 'PID:START:PIDNS' of the process whose `with` holds it

    # names: namespace PREFIX-nK with eth0 inside, bridge port PREFIX-vK, bridge PREFIX-br
    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    def ns(self, k: int) -> str:
        return f"{self.prefix}-n{k}"

    def port(self, k: int) -> str:
        return f"{self.prefix}-v{k}"

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def rates(self) -> dict[str, int]:
        return {f"node{k}": self.server_rate if k == 0 else self.rate for k in range(self.nodes)}

    def _alias(self) -> str:
        return (f"netcluster nodes={self.nodes} ranks_per_node={self.ranks_per_node} "
                f"rate={self.rate} server_rate={self.server_rate} cpus_per_node={self.cpus_per_node}"
                + (f" holder={self.holder}" if self.holder else ""))

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX) -> "NetCluster":
        """The cluster that ``up`` left running under ``prefix`` (settings read from the bridge)."""
        alias = _bridge_alias(check_prefix(prefix))
        if alias is None or not alias.startswith("netcluster "):
            raise NetClusterError(f"no cluster '{prefix}' is up: start one with 'python "
                                  f"benchmarks/netcluster.py up N --rate R{_flag(prefix)}'")
        kv = dict(item.split("=", 1) for item in alias.split()[1:])
        return cls(int(kv["nodes"]), int(kv["rate"]), int(kv["server_rate"]),
                   int(kv["ranks_per_node"]), prefix, int(kv.get("cpus_per_node", 0)))

    def _tbf(self, dev: str, bits: int, ns: str | None = None) -> None:
        # burst: at least 64 KiB (one GSO packet) and 4 ms of the rate (tbf needs >= rate/HZ)
        burst = max(64 * 1024, bits // 8 // 250)
        _cmd(["tc", *(["-n", ns] if ns else []), "qdisc", "add", "dev", dev, "root", "tbf",
              "rate", f"{bits}bit", "burst", str(burst), "latency", LATENCY])

    def _add_node(self, k: int, bits: int) -> None:
        ns, port = self.ns(k), self.port(k)
        _cmd(["ip", "netns", "add", ns])
        _cmd(["ip", "link", "add", "name", port, "type", "veth", "peer", "name", NODE_IF, "netns", ns])
        _cmd(["ip", "link", "set", port, "master", self.bridge])
        _cmd(["ip", "link", "set", port, "up"])
        _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
        _cmd(["ip", "-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", NODE_IF])
        _cmd(["ip", "-n", ns, "link", "set", NODE_IF, "up"])
        self._tbf(NODE_IF, bits, ns)        # what node k sends
        self._tbf(port, bits)               # what node k receives (the bridge's egress towards it)

    def up(self) -> "NetCluster":
        why = requirements_missing()
        if why:
            raise NetClusterError(why)
        with _prefix_lock(self.prefix):
            self._build()
        return self

    def _build(self) -> None:
        left = leftovers(self.prefix)
        state, who = holder_state(self.prefix) if left else ("none", "")
        if state == "ended":
            # what a killed holder left (its `with` never reached the teardown): no one uses it
            removed = teardown(self.prefix)
            print(f"netcluster: removed {len(removed)} namespace(s)/link(s) that {who}, which has "
                  f"ended, left under '{self.prefix}'", file=sys.stderr, flush=True)
            left = leftovers(self.prefix)
        if left:
            raise NetClusterError(f"leftovers of an earlier cluster exist ({', '.join(left)}): "
                                  f"remove them with '{CLEAN}{_flag(self.prefix)}'")
        try:
            _cmd(["ip", "link", "add", "name", self.bridge, "type", "bridge"])
            _cmd(["ip", "link", "set", self.bridge, "alias", self._alias()])
            _cmd(["ip", "link", "set", self.bridge, "up"])
            for k, bits in enumerate(self.rates().values()):
                self._add_node(k, bits)
        except BaseException:
            teardown(self.prefix)           # (under the lock: only what this call built)
            raise

    def down(self) -> list[str]:
        return teardown(self.prefix)

    def __enter__(self) -> "NetCluster":
        if threading.current_thread() is threading.main_thread():
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_exits)
        self.holder = _holder_of(os.getpid())     # this process holds it until its teardown
        try:
            return self.up()
        except BaseException:
            self._restore_sigterm()
            raise

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            self.holder = None
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def counters(self) -> dict[str, Traffic]:
        """Cumulative bytes per node since ``up``."""
        return {f"node{k}": Traffic(_qdisc_bytes(NODE_IF, self.ns(k)), _qdisc_bytes(self.port(k)))
                for k in range(self.nodes)}

    def cpus(self, k: int) -> str:
        """Node k's CPUs for taskset ('' = all): C consecutive CPUs from k*C, wrapping around."""
        c, n = self.cpus_per_node, os.cpu_count()
        return ",".join(str((k * c + i) % n) for i in range(c)) if c else ""

    def wrap(self, k: int) -> list[str]:
        """argv prefix that runs a command on node k: its network namespace, hostname ``nodeK``,
        and its CPUs if ``cpus_per_node`` is set (what its processes inherit)."""
        pin = ["taskset", "-c", self.cpus(k)] if self.cpus_per_node else []
        return ["ip", "netns", "exec", self.ns(k), *pin, "unshare", "--uts", "sh", "-c",
                f'hostname node{k} && exec "$@"', "sh"]

    def launch(self, cmd: list[str], mpiexec: str | None = None,
               layout: list[int] | None = None) -> tuple[list[str], dict[str, str]]:
        """(argv, environment additions) of one mpiexec on node0 that starts ``cmd`` as K ranks per
        node, in node order (ranks 0..K-1 on node0, K..2K-1 on node1, ...); ``layout``: the ranks
        on each node instead (its length the node count, each at least 1)."""
        exe = mpiexec or default_mpiexec()
        cmd = [shutil.which(cmd[0]) or cmd[0], *cmd[1:]]        # absolute: see docs/cluster.md
        layout = [self.ranks_per_node] * self.nodes if layout is None else [int(k) for k in layout]
        if len(layout) != self.nodes or min(layout) < 1:
            raise NetClusterError(f"layout {layout}: one rank count >= 1 per node ({self.nodes} nodes)")
        hosts = ",".join(f"node{k}:{r}" for k, r in enumerate(layout))
        n = ["-n", str(sum(layout))]
        if mpi_flavor(exe) == "mpich":
            return [*self.wrap(0), exe, *MPICH_ARGS, "-hosts", hosts, *n, *cmd], dict(MPICH_ENV)
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [*self.wrap(0), exe, *root, *OPENMPI_ARGS, "--host", hosts, *n, *cmd], dict(OPENMPI_ENV)

    def run(self, cmd: list[str], *, mpiexec: str | None = None, env: dict | None = None,
            timeout: float | None = None, capture: bool = False, cwd=None,
            layout: list[int] | None = None) -> RunResult:
        """Runs ``cmd`` on every node under one mpiexec (``layout``: ranks per node, as ``launch``);
        returns its status, output (if captured)
        and the bytes each node sent and received meanwhile.  The MPI settings of ``launch`` are
        defaults: this process's environment and then ``env`` override them.  On a timeout or
        Ctrl-C the whole job is stopped (and, after a grace period, killed)."""
        argv, mpi_env = self.launch(cmd, mpiexec, layout)
        full_env = {**mpi_env, **os.environ, **(env or {}), "NETCLUSTER_PREFIX": self.prefix,
                    "NETCLUSTER_CPUS": ";".join(self.cpus(k) for k in range(self.nodes))}
        segments = _mpi_segments()
        before, t0 = self.counters(), time.perf_counter()
        pipe = subprocess.PIPE if capture else None
        proc = subprocess.Popen(argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=pipe,
                                stderr=pipe, text=True, start_new_session=True)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            out, err = self._stop(proc)
        except BaseException:
            self._stop(proc)
            raise
        finally:
            if proc.returncode:       # ranks of a failed job may outlive their launcher for a moment:
                for k in range(self.nodes):   # kill them (and unlink what they map) before cleaning
                    _kill_inside(self.ns(k))
            _remove_new_segments(segments)
        seconds = time.perf_counter() - t0
        after = self.counters()
        traffic = {n: Traffic(after[n].sent - before[n].sent, after[n].received - before[n].received)
                   for n in after}
        return RunResult(proc.returncode, out, err, traffic, seconds, timed_out)

    def _stop(self, proc: subprocess.Popen, grace: float = 5.0) -> tuple[str | None, str | None]:
        """Ends a job: SIGTERM to its process group (mpiexec passes it to the ranks), SIGKILL after
        ``grace`` seconds, then whatever still runs inside the nodes."""
        with _signals_deferred():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            for k in range(self.nodes):
                _kill_inside(self.ns(k))
        return out, err


def _sigterm_exits(signum, frame):
    raise SystemExit(128 + signum)


def _mpi_segments() -> set[Path]:
    if not shm.SHM_DIR.is_dir():
        return set()
    return {Path(e.path) for e in os.scandir(shm.SHM_DIR) if shm.is_mpi_segment(Path(e.path))}


def _remove_new_segments(before: set[Path]) -> list[Path]:
    """Unlinks MPI segments in /dev/shm that appeared during a run and no live process uses (a job
    that was killed never reaches MPI_Finalize, which would have removed them)."""
    new = _mpi_segments() - before
    if not new:
        return []
    stale = new - shm.in_use()
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
    return sorted(stale)


# ---- command line ------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="netcluster.py", description=__doc__.split("\n\n")[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def shape(sp, required):
        sp.add_argument("--rate", required=required, help="per-node link rate both ways, e.g. 1gbit")
        sp.add_argument("--server-rate", help="node0's rate (rank 0: the easgd/asgd server)")
        sp.add_argument("--ranks-per-node", type=int, default=1)
        sp.add_argument("--cpus-per-node", type=int, default=0,
                        help="bind node k to C CPUs from k*C (wrapping); 0: every node sees all")

    up = sub.add_parser("up", help="create nodes node0..N-1")
    up.add_argument("nodes", type=int)
    shape(up, True)
    run = sub.add_parser("run", help="run COMMAND on every node under one mpiexec")
    run.add_argument("--nodes", type=int, help="bring up a cluster for this run only (then down)")
    shape(run, False)
    run.add_argument("--mpiexec", help="launcher (default $MPIEXEC, else the venv's mpiexec)")
    run.add_argument("--timeout", type=float, help="seconds, then the job is stopped")
    run.add_argument("--json", type=Path, help="write the per-node byte counts here")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    sub.add_parser("status", help="the cluster's settings and counters")
    sub.add_parser("down", help="remove every namespace and link of the cluster")
    for sp in sub.choices.values():
        sp.add_argument("--prefix", default=DEFAULT_PREFIX, help="names PREFIX-br, PREFIX-nK, PREFIX-vK")
    return p


def _cmd_run(a) -> int:
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        raise NetClusterError("run needs a command after --")
    if a.nodes is None and (a.rate or a.server_rate):
        raise NetClusterError("--rate/--server-rate with run need --nodes (a cluster for this run)")
    if a.nodes is None:
        c = NetCluster.attach(a.prefix)
        res, rates = c.run(cmd, mpiexec=a.mpiexec, timeout=a.timeout), c.rates()
    else:
        with NetCluster(a.nodes, a.rate or "1gbit", a.server_rate, a.ranks_per_node, a.prefix,
                        a.cpus_per_node) as c:
            res, rates = c.run(cmd, mpiexec=a.mpiexec, timeout=a.timeout), c.rates()
    print(format_traffic(res.traffic, rates), file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps({"returncode": res.returncode, "seconds": res.seconds,
                                      "rates": rates, "traffic": {n: asdict(t) for n, t in
                                                                  res.traffic.items()}}, indent=1))
    if res.timed_out:
        raise NetClusterError(f"the job did not finish within {a.timeout:g} s and was stopped")
    return res.returncode


def _cmd_status(a) -> int:
    c = NetCluster.attach(a.prefix)
    cpus = f", {c.cpus_per_node} CPU(s) per node" if c.cpus_per_node else ""
    print(f"netcluster '{a.prefix}': {c.nodes} node(s), {c.ranks_per_node} rank(s) per node{cpus}")
    print(format_traffic(c.counters(), c.rates(), warn=False).replace("during the run", "since up"))
    return 0


def _cmd_up(a) -> int:
    c = NetCluster(a.nodes, a.rate, a.server_rate, a.ranks_per_node, a.prefix, a.cpus_per_node).up()
    rates = ", ".join(f"{n} {format_rate(r)}" for n, r in c.rates().items())
    print(f"netcluster: {c.nodes} node(s) up ({rates}; {c.ranks_per_node} rank(s) each); "
          f"remove with '{CLEAN}{_flag(a.prefix)}'")
    return 0


def _cmd_down(a) -> int:
    removed = teardown(a.prefix)
    print(f"netcluster: removed {len(removed)} namespace(s)/link(s)" + "".join(f"\n  {r}" for r in removed))
    return 0


def _flag(prefix: str) -> str:
    return f" --prefix {prefix}" if prefix != DEFAULT_PREFIX else ""


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_exits)     # a `kill` stops the job and tears down too
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C too, even when started with
    # SIGINT ignored (a shell's background job inherits that; Python then leaves it ignored)
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # `kill -USR1`: where a stuck run is
    commands = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status, "run": _cmd_run}
    try:
        return commands[a.command](a)
    except NetClusterError as exc:
        msg = str(exc)
        print(msg if msg.startswith("netcluster: ") else f"netcluster: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("netcluster: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
