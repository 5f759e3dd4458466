"""
runs/lock.py: lock files, as a shared cluster needs them: one run of an out_dir (runs/outdir.py's take_lock), one
writer of a prepared table (readers/training.py). A lock holds its process's host, pid and start time, so a lock
left by a process that died, or whose pid the system gave to another process, is told apart from a live one.

    json.dump(lock_record(command="train.py"), f)      # what a lock file holds
    alive_here(read_lock(path))                       # True while its process runs on this host
"""
import json
import os
import socket


def lock_record(**fields):
    """What a lock file holds of the process taking it: its host, pid and start time (process_start), and fields."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "process_start": process_start(os.getpid()), **fields}


def read_lock(path):
    """A lock file's record (lock_record), or None when there is none or it is empty (being written, or cut short)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def process_start(pid):
    """When process pid started (clock ticks since boot, /proc/<pid>/stat), so a pid the system reused for another
    process is told apart; None when there is no such process. Without /proc: True while the pid exists."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command in parentheses
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(int(pid), 0)
            return True
        except OSError:
            return None


def alive_here(record):
    """True when a lock's process runs on this host: its pid exists and started when the lock says."""
    if record.get("host") != socket.gethostname():
        return False
    try:
        started = process_start(record["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    return started is not None and started == record.get("process_start", started)
