"""One process of this machine for its whole life (a pid is reused, its start time is not):
a state home's executor, and the JVM whose workers a secret is left for."""

from __future__ import annotations

import dataclasses

__all__ = ["ProcessRef", "proc_stat"]


@dataclasses.dataclass(frozen=True)
class ProcessRef:
    """One process for its whole life: its pid and its start time (a pid is reused)."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        stat = proc_stat(pid)
        return None if stat is None else cls(pid, int(stat[19]))

    @classmethod
    def parse(cls, text: str) -> ProcessRef:
        pid, start = text.split(":")
        return cls(int(pid), int(start))

    def __str__(self) -> str:
        return f"{self.pid}:{self.start}"

    def alive(self) -> bool:
        """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
        stat = proc_stat(self.pid)
        return stat is not None and int(stat[19]) == self.start and stat[0] not in ("Z", "X")


def proc_stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command (the 4th field, ppid, is index 1)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()
