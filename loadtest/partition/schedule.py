"""Schedules of faults: cuts of one path of one member (in a PathProxy mode, for some seconds,
then healed), kill -9 of a member (started again after some seconds), and cuts that overlap.

A ``Schedule`` is a list of ``Step``s run one after the other; a step's actions start at their
``at_s`` from the step's start and the step ends when the last of them has healed. Members are
named by their role when the step starts (``"master"``, ``"slave"``), so a step means the same
whichever member holds the role by then.

``random_schedule(seed)`` draws a schedule from a seed (the same seed, the same schedule; print
it to replay one); ``NAMED`` holds the fixed cases, among them the findings that motivated the
tier:

- ``asymmetric-cp-cut``: the master's heartbeats reach the control plane, its answers do not
  come back (finding 1: all writes stopped for the whole cut);
- ``cp-hold``: the master cannot reach the control plane at all (finding 2: the slave promoted,
  the old master never learned to follow, SLAVE_NOT_AVAILABLE for the whole cut);
- ``two-step``: the master isolated from the control plane and its slave; then, while the old
  master learns it was demoted, the new master's HA path and then its control-plane path are
  cut, so the demoted member never reaches the new master and stands in the next election with
  its own, longer log (finding 4: it won on that higher offset).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from loadtest.partition.cluster import NetPath
from loadtest.partition.proxy import Mode

Who = Literal["master", "slave"]
# A named single-path cut: long enough that a cut which stops writes from the master's fencing
# (~lease - check interval into it) until its heal passes lease + 3 s (9 s by default) without a
# SEND_OK.
CUT_S = 11.0  # over lease + 3 s: a cut that stopped writes until its heal would show
TWO_STEP_CUT_S = 11.0


@dataclass(frozen=True)
class Cut:
    at_s: float
    who: Who
    path: NetPath
    mode: Mode
    duration_s: float
    flap_ms: int = 1000

    def describe(self) -> str:
        flap = f"/{self.flap_ms}ms" if self.mode is Mode.FLAP else ""
        return f"+{self.at_s:g}s {self.who} {self.path.value} {self.mode.value}{flap} {self.duration_s:g}s"


@dataclass(frozen=True)
class Kill:
    at_s: float
    who: Who
    down_s: float  # started again this long after the kill

    def describe(self) -> str:
        return f"+{self.at_s:g}s kill -9 {self.who}, restart after {self.down_s:g}s"


Action = Cut | Kill


@dataclass(frozen=True)
class Step:
    kind: str  # figures are grouped by it
    actions: tuple[Action, ...]

    @property
    def single_path(self) -> bool:
        """One path of one member cut: the availability target applies."""
        return len(self.actions) == 1 and isinstance(self.actions[0], Cut)

    @property
    def length_s(self) -> float:
        return max(a.at_s + (a.duration_s if isinstance(a, Cut) else a.down_s) for a in self.actions)

    def describe(self) -> str:
        return f"{self.kind}: " + "; ".join(a.describe() for a in self.actions)


@dataclass(frozen=True)
class Schedule:
    name: str
    steps: tuple[Step, ...]
    seed: int | None = None

    def describe(self) -> str:
        head = self.name + (f" (seed {self.seed})" if self.seed is not None else "")
        return head + "\n" + "\n".join(f"  {s.describe()}" for s in self.steps)


def cut_kind(c: Cut) -> str:
    return f"{c.path.value}:{c.mode.value}:{c.who}"


def single_cut(who: Who, path: NetPath, mode: Mode, duration_s: float = CUT_S, flap_ms: int = 1000) -> Step:
    c = Cut(0.0, who, path, mode, duration_s, flap_ms)
    return Step(cut_kind(c), (c,))


NAMED: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule("asymmetric-cp-cut", (single_cut("master", NetPath.CONTROL_PLANE, Mode.HOLD_ANSWERS),)),
        Schedule("cp-hold", (single_cut("master", NetPath.CONTROL_PLANE, Mode.HOLD),)),
        Schedule("ha-hold", (single_cut("master", NetPath.HA, Mode.HOLD),)),
        Schedule("client-hold", (single_cut("master", NetPath.CLIENT, Mode.HOLD),)),
        Schedule("cp-flap", (single_cut("master", NetPath.CONTROL_PLANE, Mode.FLAP, flap_ms=1000),)),
        Schedule(
            "two-step",
            (
                Step(
                    "two-step",
                    (
                        # the master cut off from the control plane and from its slave: it goes on
                        # storing (unacknowledged) until its lease runs out; the slave is elected
                        Cut(0.0, "master", NetPath.CONTROL_PLANE, Mode.HOLD, TWO_STEP_CUT_S),
                        Cut(0.0, "master", NetPath.HA, Mode.HOLD, TWO_STEP_CUT_S),
                        # the new master's HA path cut before the old one hears it was demoted: the
                        # demoted member never reaches it, so its longer log is never truncated
                        Cut(9.0, "slave", NetPath.HA, Mode.HOLD, 16.0),
                        # then the new master's lease lapses while the demoted member calls in
                        Cut(14.0, "slave", NetPath.CONTROL_PLANE, Mode.HOLD, TWO_STEP_CUT_S),
                    ),
                ),
            ),
        ),
        Schedule("kill-master", (Step("kill:master", (Kill(0.0, "master", 8.0),)),)),
    )
}

# What a random step may be, and how often.
PATHS = (NetPath.CONTROL_PLANE, NetPath.HA, NetPath.CLIENT)
MODES = (Mode.HOLD, Mode.HOLD_ANSWERS, Mode.RESET, Mode.FLAP)


def random_step(rng: random.Random) -> Step:
    roll = rng.random()
    who: Who = "master" if rng.random() < 0.75 else "slave"
    if roll < 0.6:  # one path of one member
        mode = rng.choice(MODES)
        return single_cut(who, rng.choice(PATHS), mode, round(rng.uniform(2.0, 12.0), 1),
                          flap_ms=rng.choice((300, 700, 1500)))  # fmt: skip
    if roll < 0.8:  # kill -9
        return Step(f"kill:{who}", (Kill(0.0, who, round(rng.uniform(1.0, 10.0), 1)),))
    # two cuts that overlap, on different (member, path)s
    first = Cut(0.0, who, rng.choice(PATHS), rng.choice(MODES), round(rng.uniform(4.0, 12.0), 1),
                rng.choice((300, 700, 1500)))  # fmt: skip
    other_who: Who = rng.choice(("master", "slave"))
    paths = [p for p in PATHS if (other_who, p) != (first.who, first.path)]
    second = Cut(round(rng.uniform(1.0, first.duration_s - 1.0), 1), other_who, rng.choice(paths),
                 rng.choice(MODES), round(rng.uniform(3.0, 10.0), 1), rng.choice((300, 700, 1500)))  # fmt: skip
    return Step("overlap", (first, second))


def random_schedule(seed: int, *, steps: tuple[int, int] = (1, 3)) -> Schedule:
    """A schedule drawn from ``seed``: between ``steps[0]`` and ``steps[1]`` steps."""
    rng = random.Random(seed)
    return Schedule(f"random-{seed}", tuple(random_step(rng) for _ in range(rng.randint(*steps))), seed)
