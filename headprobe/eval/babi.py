"""Reasoning-in-a-haystack: bAbI-style questions over a few facts hidden in the haystack.

Four task types, generated from a small simulated world (people move between rooms, pick up and drop
objects), every answer computed from the world state the facts describe:

- ``single``: one supporting fact ("Where is Mary?").
- ``two``: two or more supporting facts ("Where is the apple?": who carried it, where they went).
- ``count``: counting ("How many objects is Daniel carrying?", answered in words).
- ``yesno``: yes/no ("Is Sandra in the kitchen?").

The facts form one needle placed at the depth; the question follows the document. Scored by exact answer
against the choices of its type (:func:`headprobe.eval.answer_scores.exact_answer`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import HeadprobeError, param

PEOPLE = ("Mary", "John", "Sandra", "Daniel", "Fiona", "Oscar")
PLACES = ("kitchen", "garden", "office", "hallway", "bedroom", "bathroom", "cellar", "balcony")
OBJECTS = ("apple", "football", "milk", "key", "umbrella", "lamp")
NUMBERS = ("none", "one", "two", "three", "four")
MOVES = ("went to", "moved to", "travelled to", "journeyed to")
TAKES = ("picked up", "took", "grabbed")
DROPS = ("dropped", "put down", "left")
BABI_TASKS = ("single", "two", "count", "yesno")


@dataclass(frozen=True)
class BabiQuestion:
    """One generated question.

    Attributes
    ----------
    id
        ``babi-<task>-<n>``.
    task
        One of :data:`BABI_TASKS`.
    facts
        The fact sentences, in story order.
    question
        The question asked after the document.
    answer
        The gold answer (one word).
    choices
        Every answer of this question's type (locations, numbers, or yes/no).
    """

    id: str
    task: str
    facts: tuple[str, ...]
    question: str
    answer: str
    choices: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.facts)


class _World:
    def __init__(self, rng: random.Random, people: list[str]) -> None:
        self.rng = rng
        self.where: dict[str, str] = {}
        self.holding: dict[str, list[str]] = {p: [] for p in people}
        self.facts: list[str] = []

    def move(self, person: str, place: str | None = None) -> None:
        choices = [p for p in PLACES if p != self.where.get(person)]
        place = place or self.rng.choice(choices)
        self.where[person] = place
        self.facts.append(f"{person} {self.rng.choice(MOVES)} the {place}.")

    def take(self, person: str, obj: str) -> None:
        self.holding[person].append(obj)
        self.facts.append(f"{person} {self.rng.choice(TAKES)} the {obj}.")

    def drop(self, person: str, obj: str) -> None:
        self.holding[person].remove(obj)
        self.facts.append(f"{person} {self.rng.choice(DROPS)} the {obj}.")


def generate_question(task: str, rng: random.Random, index: int = 0) -> BabiQuestion:
    """One question of ``task`` drawn with ``rng``.

    Raises
    ------
    HeadprobeError
        Unknown task type.
    """
    if task not in BABI_TASKS:
        raise HeadprobeError(f"{param('task', task)}: unknown task; expected one of {', '.join(BABI_TASKS)}")
    people = rng.sample(PEOPLE, 3)
    world = _World(rng, people)
    qid = f"babi-{task}-{index}"
    places = tuple(PLACES)
    if task == "single":
        for _ in range(4):
            world.move(rng.choice(people))
        target = rng.choice(sorted(world.where))
        return BabiQuestion(qid, task, tuple(world.facts), f"Where is {target}?", world.where[target], places)
    if task == "two":
        carrier = people[0]
        obj = rng.choice(OBJECTS)
        world.move(people[1])
        world.take(carrier, obj)
        world.move(people[2])
        world.move(carrier)
        if rng.random() < 0.5:
            world.move(carrier)
        return BabiQuestion(qid, task, tuple(world.facts), f"Where is the {obj}?", world.where[carrier], places)
    if task == "count":
        person = people[0]
        objs = rng.sample(OBJECTS, 3)
        world.move(person)
        for obj in objs[:rng.randint(1, 3)]:
            world.take(person, obj)
            if rng.random() < 0.3:
                world.move(people[1])
        if world.holding[person] and rng.random() < 0.6:
            world.drop(person, rng.choice(world.holding[person]))
        n = len(world.holding[person])
        return BabiQuestion(qid, task, tuple(world.facts), f"How many objects is {person} carrying?",
                            NUMBERS[n], NUMBERS)
    # yesno
    for _ in range(4):
        world.move(rng.choice(people))
    target = rng.choice(sorted(world.where))
    asked = world.where[target] if rng.random() < 0.5 else rng.choice([p for p in PLACES if p != world.where[target]])
    answer = "yes" if asked == world.where[target] else "no"
    return BabiQuestion(qid, task, tuple(world.facts), f"Is {target} in the {asked}?", answer, ("yes", "no"))


def generate_questions(count: int, tasks: tuple[str, ...] | list[str] = BABI_TASKS, seed: int = 0) -> list[BabiQuestion]:
    """``count`` questions cycling over ``tasks``, deterministic for a seed."""
    if count < 1:
        raise HeadprobeError(f"{param('count', count)}: expected at least 1")
    for task in tasks:
        if task not in BABI_TASKS:
            raise HeadprobeError(f"{param('tasks', task)}: unknown task; expected one of {', '.join(BABI_TASKS)}")
    rng = random.Random(seed)
    tasks = list(tasks)
    return [generate_question(tasks[i % len(tasks)], rng, i) for i in range(count)]
