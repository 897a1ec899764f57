"""MPI shared-memory segments in /dev/shm, and removing the ones a dead job left behind.

MPICH keeps one segment per node, ``/dev/shm/mpich_shm_<job>_<n>``, mapped by every rank of the node;
Open MPI one per rank, ``sm_segment.<host>.<uid>.<job>.<rank>`` (``vader_segment.*`` before 5.0).
The library unlinks them in MPI_Finalize; a job ended by MPI_Abort or SIGKILL never gets there, so the
files stay in RAM until someone removes them, and MPICH names them after the job id, so a later job
that reuses the id can hang in MPI_Init on the stale file.

Unlinking a segment that is still mapped is safe: existing mappings stay valid and the memory goes
back when the last process unmaps it; only a process that has not opened it yet can no longer do so.
Standard library only: ``python src/scalesgd/comm/shm.py`` runs without the package installed.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.")    # MPICH; Open MPI 5; Open MPI 4


def is_mpi_segment(path: Path) -> bool:
    return path.parent == SHM_DIR and path.name.startswith(PREFIXES)


def _shm_path(name: str, deleted: bool) -> Path | None:
    """The /dev/shm file a /proc maps line or fd link names; an unlinked one (" (deleted)") under
    its former name if ``deleted``, else None, as for any name outside /dev/shm."""
    if not name.startswith(f"{SHM_DIR}/"):
        return None
    if name.endswith(" (deleted)"):
        if not deleted:
            return None
        name = name[:-len(" (deleted)")]
    return Path(name)


def mapped_files(pid: str | int = "self", deleted: bool = False) -> set[Path]:
    """Files under /dev/shm that process ``pid`` maps, from /proc/PID/maps (unlinked ones, whose
    line ends in " (deleted)", skipped unless ``deleted``: then their former names are included).
    Empty when the process is gone or not ours to read."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)                 # addr perms offset dev inode path
                path = len(fields) == 6 and _shm_path(fields[5].rstrip("\n"), deleted)
                if path:
                    found.add(path)
    except OSError:
        pass
    return found


def open_files(pid: str | int, deleted: bool = False) -> set[Path]:
    """Files under /dev/shm that process ``pid`` holds open (a segment between shm_open and mmap);
    unlinked ones skipped unless ``deleted``, as in ``mapped_files``."""
    found = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            path = _shm_path(target, deleted)
            if path:
                found.add(path)
    except OSError:
        pass
    return found


def unlink_mapped_segments() -> list[Path]:
    """On the abort path: unlink the MPI segments this process maps (every rank of a node maps the
    node's segment, so the aborting rank frees it for all of them).  Never raises."""
    removed = []
    for path in sorted(mapped_files()):
        if is_mpi_segment(path):
            try:
                path.unlink()
                removed.append(path)
            except OSError:                 # a peer was faster, or not ours
                pass
    return removed


def release_node_segment(node_comm) -> list[Path]:
    """Collective over the node's ranks, right after MPI_Init: MPICH's node segment
    (``mpich_shm_*``) is unlinked by the node's first rank once every rank of the node has mapped it
    (MPI_Init maps it; the barrier makes sure every rank is past that).  The mappings stay valid for
    the whole job and the memory goes back when the last rank exits, however it exits: a job killed
    by SIGKILL (one rank, or all of them) leaves nothing in /dev/shm, where MPI_Finalize never runs.
    Open MPI's per-rank segments are opened by peers later, on first contact, so they keep their
    names (``python -m scalesgd.comm.shm`` removes stale ones).  Never raises."""
    try:
        node_comm.Barrier()
        if node_comm.Get_rank() != 0:
            return []
    except Exception:  # noqa: BLE001 - a cleanup must never be the reason a job fails
        return []
    removed = []
    for path in sorted(mapped_files()):
        if is_mpi_segment(path) and path.name.startswith("mpich_shm_"):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def in_use() -> set[Path]:
    """Every /dev/shm file some live process we can inspect maps or holds open, also under the name
    it had if it was unlinked since: a segment listed before the scan and unlinked during it (MPICH's
    node segment, by ``release_node_segment``, right after MPI_Init) is in use, not stale.
    A process's descriptors are read before its mappings: a creator that opens, maps and then closes
    its segment is seen holding it or mapping it, whenever the scan reaches it (read the other way
    round, the scan could see neither)."""
    used: set[Path] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            used |= open_files(entry.name, deleted=True)          # (first: see above)
            used |= mapped_files(entry.name, deleted=True)
    return used


def stale_segments(uid: int | None = None) -> list[Path]:
    """MPI segments owned by ``uid`` (default: this user) that no live process maps or holds open.
    The directory is listed before /proc is scanned, so a segment created meanwhile is not a
    candidate, and one listed earlier is seen through its creator's mapping or open descriptor."""
    uid = os.getuid() if uid is None else uid
    candidates = []
    for entry in os.scandir(SHM_DIR):
        try:
            if entry.name.startswith(PREFIXES) and entry.stat(follow_symlinks=False).st_uid == uid:
                candidates.append(Path(entry.path))
        except OSError:
            continue
    used = in_use()
    return sorted(p for p in candidates if p not in used)


def clean_stale(dry_run: bool = False) -> tuple[list[Path], int]:
    """Removes this user's stale MPI segments; returns (paths, bytes freed)."""
    removed, freed = [], 0
    for path in stale_segments():
        try:
            size = path.stat().st_size
            if not dry_run:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
        freed += size
    return removed, freed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalesgd.comm.shm",
        description="Remove this user's MPI shared-memory segments in /dev/shm that no live process "
                    f"uses ({', '.join(p + '*' for p in PREFIXES)}), left by jobs that ended in "
                    "MPI_Abort or SIGKILL.")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    args = parser.parse_args(argv)
    if not SHM_DIR.is_dir():
        print(f"scalesgd: no {SHM_DIR} on this machine, nothing to clean")
        return 0
    removed, freed = clean_stale(args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    host = os.uname().nodename
    print(f"scalesgd: {host}: {verb} {len(removed)} stale MPI segment(s) in {SHM_DIR} "
          f"({freed / 2**20:.1f} MiB)" + "".join(f"\n  {p}" for p in removed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
