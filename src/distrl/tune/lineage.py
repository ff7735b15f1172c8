"""The lineage of a population-based training study: what each member did, and whose weights it went on from.

``STUDY_DIR/lineage.jsonl`` holds one JSON object a line, appended by the study's driver (one writer, so a
line is never torn and the order is the order in which the driver learnt of the events):

* ``{"event": "start", "member": "member-000", "hyperparameters": {...}}``: a member and its first values.
* ``{"event": "eval", "member", "step", "return"}``: the evaluation that ends each perturbation interval.
* ``{"event": "exploit", "member", "step", "source", "source_step", "source_exploits",
  "source_hyperparameters", "old", "new"}``: at its own ``step`` the member took the ``source``'s checkpoint
  of ``source_step`` (written after the source's own ``source_exploits``-th exploit) and went on from there
  with the ``new`` hyperparameters (``old``: its own until then; ``source_hyperparameters``: the source's,
  which PBT perturbed into ``new``).
* ``{"event": "restart", "member", "failed_after", "step", "error"}``: the member failed after its
  evaluation at ``failed_after`` and went on from its own last checkpoint, at ``step`` (0: from scratch).
* ``{"event": "failed", "member", "step", "error"}``: the member failed once more than allowed and stopped.

A member's ``source_exploits`` pins down which of the source's histories it copied: a member can copy
another at a step it has passed before (an exploit may go back in steps), so a step alone would not.
A restart adds no segment: every interval begins the same way whether a member went on in memory or
from its checkpoint (see :func:`distrl.tune.member.advance`), so it trains exactly the steps it would have.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LINEAGE_FILE = "lineage.jsonl"


@dataclass(frozen=True)
class Segment:
    """Steps ``from_step`` to ``to_step`` of a member's ancestry, trained by ``member`` with ``hyperparameters``,
    starting from ``started_from``'s checkpoint at ``from_step`` (None: the network's initialisation)."""

    member: str
    from_step: int
    to_step: int
    hyperparameters: dict[str, Any]
    started_from: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Segment:
        return cls(
            data["member"],
            int(data["from_step"]),
            int(data["to_step"]),
            dict(data["hyperparameters"]),
            data["started_from"],
        )


def append_event(path: Path, event: dict[str, Any]) -> None:
    """One event as one line of ``path``, flushed at once (a study stopped midway keeps what happened)."""
    with path.open("a") as f:
        f.write(json.dumps(event) + "\n")


def read_lineage(path: Path) -> list[dict[str, Any]]:
    """The events of a lineage file, in order; a last line cut off by a killed driver is left out."""
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def members(events: list[dict[str, Any]]) -> list[str]:
    """The members, in the order they started."""
    return [e["member"] for e in events if e["event"] == "start"]


def final_returns(events: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """Each member's last evaluation: (step, mean return)."""
    last: dict[str, tuple[int, float]] = {}
    for e in events:
        if e["event"] == "eval":
            last[e["member"]] = (int(e["step"]), float(e["return"]))
    return last


def schedule(events: list[dict[str, Any]], member: str) -> list[Segment]:
    """``member``'s whole ancestry up to its last evaluation, as consecutive segments from step 0.

    The last segment is the member's own since its last exploit; before it come the segments of the member
    it copied, up to the step of the checkpoint it copied, and so on back to a member that never copied.
    """
    start = {e["member"]: e["hyperparameters"] for e in events if e["event"] == "start"}
    exploits: dict[str, list[dict[str, Any]]] = {name: [] for name in start}
    for e in events:
        if e["event"] == "exploit":
            exploits[e["member"]].append(e)
    last_step = final_returns(events)
    if member not in start:
        raise KeyError(f"{member!r} is not a member of this study: {', '.join(start)}")

    def ancestry(name: str, exploited: int, until: int) -> list[Segment]:
        """``name``'s segments after its first ``exploited`` exploits, ending at step ``until``."""
        if exploited == 0:
            return [Segment(name, 0, until, dict(start[name]), None)]
        e = exploits[name][exploited - 1]
        source_step = int(e["source_step"])
        before = ancestry(e["source"], int(e["source_exploits"]), source_step)
        return [*before, Segment(name, source_step, until, dict(e["new"]), e["source"])]

    return ancestry(member, len(exploits[member]), last_step.get(member, (0, 0.0))[0])


def counts(events: list[dict[str, Any]], kind: str) -> dict[str, int]:
    """How many events of ``kind`` (exploit, restart) each member has."""
    out = {name: 0 for name in members(events)}
    for e in events:
        if e["event"] == kind:
            out[e["member"]] = out.get(e["member"], 0) + 1
    return out
