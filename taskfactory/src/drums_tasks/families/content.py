"""Seeded content vocabulary: ASCII only (pyautogui types it), no value a prefix of another
(LibreOffice's AutoInput would complete it), sentences short enough to stay on one line."""

from __future__ import annotations

import random

ITEMS = [
    "Anchor",
    "Basket",
    "Candle",
    "Drill",
    "Easel",
    "Funnel",
    "Gasket",
    "Hammer",
    "Ink pad",
    "Jigsaw",
    "Kettle",
    "Ladle",
    "Mallet",
    "Napkin",
    "Oven mitt",
    "Padlock",
    "Quilt",
    "Rivet",
    "Stapler",
    "Trowel",
    "Umbrella",
    "Valve",
    "Wrench",
    "Yarn",
    "Zipper",
    "Bucket",
    "Chisel",
    "Doormat",
    "Eyelet",
    "Flask",
    "Goggles",
    "Hinge",
]
REGIONS = ["North", "South", "East", "West", "Central", "Coastal", "Highland", "Metro"]
PEOPLE = [
    "Alice",
    "Bruno",
    "Chloe",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hiro",
    "Ines",
    "Jonas",
    "Kara",
    "Lukas",
    "Mona",
    "Nils",
    "Olga",
    "Pavel",
    "Quinn",
    "Rosa",
    "Sami",
    "Tomas",
]
SHEETS = ["Sales", "Budget", "Inventory", "Orders", "Costs", "Stock"]
OTHER_SHEETS = ["Archive", "Summary", "Notes", "Old"]
TOPICS = [
    "the harbor project",
    "the spring audit",
    "the new warehouse",
    "the staff survey",
    "the river cleanup",
    "the library move",
    "the bus timetable",
    "the solar pilot",
    "the school garden",
    "the data migration",
    "the museum visit",
    "the road repairs",
]
VERBS = ["covers", "reviews", "explains", "summarizes", "describes", "lists", "tracks", "outlines"]
OBJECTS = [
    "the weekly costs",
    "the open risks",
    "the main goals",
    "the next steps",
    "the team roles",
    "the budget limits",
    "the safety rules",
    "the delivery dates",
    "the test results",
    "the vendor list",
    "the meeting notes",
    "the travel plans",
    "the print orders",
]
ADVERBS = [
    "in detail",
    "in brief",
    "for the board",
    "for new staff",
    "for the auditors",
    "once more",
]


def sentence(rng: random.Random) -> str:
    s = f"{rng.choice(TOPICS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.6:
        s += f" {rng.choice(ADVERBS)}"
    return s + "."


def sentences(rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        s = sentence(rng)
        if s not in out:
            out.append(s)
    return out


def pick(rng: random.Random, pool: list[str], n: int) -> list[str]:
    return rng.sample(pool, n)


def filename(rng: random.Random, stems: list[str], ext: str) -> str:
    return f"{rng.choice(stems)}_{rng.randint(10, 99)}.{ext}"
