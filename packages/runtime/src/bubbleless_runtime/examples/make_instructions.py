"""Writes ``instructions.jsonl``: short instruction/answer chats generated from small tables written for
this repository (arithmetic, unit conversions, capitals, opposites), deterministic from a seed.

    python -m bubbleless_runtime.examples.make_instructions > instructions.jsonl

CC0 1.0 (public domain dedication), see ``DATA_LICENSE.md``.
"""

from __future__ import annotations

import json
import random
import sys

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Canada": "Ottawa", "Australia": "Canberra",
    "Brazil": "Brasilia", "Argentina": "Buenos Aires", "Egypt": "Cairo", "Kenya": "Nairobi", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Poland": "Warsaw", "Greece": "Athens", "Ireland": "Dublin",
    "Austria": "Vienna", "Peru": "Lima", "Chile": "Santiago", "Mexico": "Mexico City", "Turkey": "Ankara",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Denmark": "Copenhagen", "Hungary": "Budapest", "Cuba": "Havana",
}
UNITS = [  # (from, to, factor)
    ("kilometres", "metres", 1000), ("metres", "centimetres", 100), ("kilograms", "grams", 1000),
    ("litres", "millilitres", 1000), ("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24),
    ("weeks", "days", 7),
]
OPPOSITES = {
    "hot": "cold", "up": "down", "big": "small", "fast": "slow", "early": "late", "open": "closed",
    "light": "dark", "full": "empty", "happy": "sad", "old": "new", "high": "low", "left": "right",
}


def records(seed: int = 0):
    rng = random.Random(seed)
    for _ in range(150):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice(["plus", "minus", "times"])
        value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
        sign = {"plus": "+", "minus": "-", "times": "*"}[op]
        yield f"What is {a} {op} {b}?", f"{a} {sign} {b} = {value}."
    for _ in range(120):
        source, target, factor = rng.choice(UNITS)
        n = rng.randint(2, 40)
        yield f"Convert {n} {source} to {target}.", f"{n} {source} is {n * factor} {target}."
    for country, capital in CAPITALS.items():
        yield f"What is the capital of {country}?", f"The capital of {country} is {capital}."
        yield f"Which city is the capital of {country}?", f"{capital} is the capital of {country}."
    for word, opposite in OPPOSITES.items():
        yield f"What is the opposite of {word}?", f"The opposite of {word} is {opposite}."


def main() -> None:
    for question, answer in records():
        chat = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        sys.stdout.write(json.dumps({"messages": chat}) + "\n")


if __name__ == "__main__":
    main()
