"""A small learnable parallel corpus for end-to-end runs: word-for-word translation with reordering.

Each German-like source word maps to one English-like target word; adjective-noun pairs swap order,
so the model must learn attention, not just copying. Deterministic for a given seed.
"""

import random
from pathlib import Path

NOUNS = ["haus", "katze", "hund", "baum", "auto", "buch", "tisch", "stadt", "fluss", "berg", "vogel", "kind"]
ADJECTIVES = ["rot", "gross", "klein", "alt", "neu", "schnell", "blau", "gut"]
VERBS = ["sieht", "hat", "liebt", "malt", "kauft", "findet"]
TRANSLATION = {
    **{w: f"{w}_en" for w in NOUNS},
    **{w: f"{w}_adj" for w in ADJECTIVES},
    **{w: f"{w}_v" for w in VERBS},
}


def phrase(rng):
    if rng.random() < 0.5:
        noun = rng.choice(NOUNS)
        return [noun], [TRANSLATION[noun]]
    adjective, noun = rng.choice(ADJECTIVES), rng.choice(NOUNS)
    return [noun, adjective], [TRANSLATION[adjective], TRANSLATION[noun]]  # reordered


def sentence_pair(rng):
    subject_src, subject_tgt = phrase(rng)
    object_src, object_tgt = phrase(rng)
    verb = rng.choice(VERBS)
    return subject_src + [verb] + object_src, subject_tgt + [TRANSLATION[verb]] + object_tgt


def write_corpus(directory: Path, sizes=(("train", 3000), ("valid", 100), ("test", 100)), seed=1):
    """Write ``{split}.de`` / ``{split}.en``; returns the directory."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in sizes:
        pairs = [sentence_pair(rng) for _ in range(count)]
        (directory / f"{split}.de").write_text("".join(" ".join(s) + "\n" for s, _ in pairs))
        (directory / f"{split}.en").write_text("".join(" ".join(t) + "\n" for _, t in pairs))
    return directory
