"""Resumable steps and line-oriented text files.

A step writes each of its outputs under a ``.partial`` name, renames them into place when all are
complete and only then leaves a done-marker recording the inputs it was built from (the source
archives' names, sizes and modification times, and the flags that shape the output). The next run skips
a step whose marker records the same inputs and whose outputs exist; any other step is redone, and so is
every step after it, which may read its outputs. A half-written file is never taken as done, and a
changed archive or flag never leaves data built from the old one.
"""

import itertools
import json
import multiprocessing
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence, Tuple


class DataPrepError(Exception):
    """A problem the user can fix (missing or wrong archive, occupied --output); shown without a traceback."""


@dataclass
class Step:
    title: str  # the progress line; also names the done-marker, so it must be unique and fixed
    outputs: Sequence[Path]
    make: Callable[..., str]  # writes each output at the path it is given; returns a summary ("1200 lines")
    # What the outputs are built from: {"sources": source_fingerprints(...), "settings": {...}};
    # None: the recipe's sources and settings, which Recipe.steps fills in.
    inputs: Optional[dict] = None


def source_fingerprints(paths: Iterable[Path]) -> dict:
    """{file name: [size, modification time in ns]}: what a done-marker compares, cheaply, for a multi-GB archive."""
    return {path.name: [path.stat().st_size, path.stat().st_mtime_ns] for path in sorted(paths)}


def run_steps(steps: Sequence[Step], done_dir: Path) -> None:
    done_dir.mkdir(parents=True, exist_ok=True)
    for number, step in enumerate(steps, 1):
        progress = f"[{number}/{len(steps)}] {step.title}"
        inputs = step.inputs or {}
        done = _read_marker(_marker(done_dir, step))
        if done is not None and done["inputs"] == inputs and all(path.exists() for path in step.outputs):
            print(f"{progress}: done before, {done['summary']}", flush=True)
            continue
        if done is not None and done["inputs"] != inputs:
            print(f"{progress}: built before from other inputs ({changes(done['inputs'], inputs)}), "
                  "so it and every later step are redone", flush=True)
        for later in steps[number - 1:]:  # they may read this step's outputs
            _remove(_marker(done_dir, later))
        print(f"{progress} ...", end="", flush=True)
        partials = [path.with_name(path.name + ".partial") for path in step.outputs]
        try:
            for partial in partials:
                _remove(partial)
                partial.parent.mkdir(parents=True, exist_ok=True)
            summary = step.make(*partials)
            for partial, path in zip(partials, step.outputs):
                _remove(path)  # left by a run that died between this rename and its marker
                os.replace(partial, path)
        except BaseException:
            print(" failed", flush=True)
            for partial in partials:
                _remove(partial)
            raise
        write_text_atomically(_marker(done_dir, step), json.dumps({"summary": summary, "inputs": inputs}))
        print(f" {summary}", flush=True)


def changes(before: dict, now: dict) -> str:
    """What differs between two steps' inputs, e.g. "de-en.tgz changed, bpe_ops 30 -> 31"."""
    sources_before, sources_now = before.get("sources", {}), now.get("sources", {})
    found = [f"{name} {'changed' if name in sources_now else 'gone'}"
             for name in sources_before if sources_before[name] != sources_now.get(name)]
    found += [f"{name} added" for name in sources_now if name not in sources_before]
    settings_before, settings_now = before.get("settings", {}), now.get("settings", {})
    found += [f"{key} {settings_before.get(key)!r} -> {settings_now.get(key)!r}"
              for key in sorted(settings_before.keys() | settings_now.keys())
              if settings_before.get(key) != settings_now.get(key)]
    return ", ".join(found)


def done_summaries(done_dir: Path, steps: Sequence[Step]) -> list:
    """(title, summary) of each finished step, for the output's README."""
    records = [(step.title, _read_marker(_marker(done_dir, step))) for step in steps]
    return [(title, done["summary"]) for title, done in records if done is not None]


def _marker(done_dir: Path, step: Step) -> Path:
    return done_dir / re.sub(r"[^\w.]+", "-", step.title).strip("-")


def _read_marker(marker: Path) -> Optional[dict]:
    """A done-marker's {"summary", "inputs"}; None when there is none, or it records no inputs (an older data-prep)."""
    try:
        done = json.loads(marker.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return done if isinstance(done, dict) and {"summary", "inputs"} <= done.keys() else None


def claim_output(output: Path, settings: dict, final_names: Iterable[str]) -> None:
    """Refuse an --output built with other settings, or holding final files this script did not make."""
    stamp = output / "tmp" / "settings.json"
    if stamp.is_file():
        previous = json.loads(stamp.read_text())
        if previous != settings:
            changed = ", ".join(
                f"{key} {previous.get(key)!r} -> {value!r}"
                for key, value in settings.items()
                if previous.get(key) != value
            )
            raise DataPrepError(
                f"{output} was built with other settings ({changed}): choose another --output or delete it"
            )
        return
    foreign = [name for name in final_names if (output / name).exists()]
    if foreign:
        raise DataPrepError(
            f"{output} already holds {', '.join(foreign)}, not made by this script: choose another --output"
        )


def stamp_output(output: Path, settings: dict) -> None:
    write_text_atomically(
        output / "tmp" / "settings.json", json.dumps(settings, indent=1, sort_keys=True) + "\n"
    )


def write_text_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except BaseException:  # a full disk: no torn file left behind
        partial.unlink(missing_ok=True)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 file without their newline, split on "\\n" only, as Perl reads them: a stray
    "\\r" stays inside its line instead of splitting it. Undecodable bytes pass through unchanged."""
    with open(path, encoding="utf-8", errors="surrogateescape", newline="\n") as lines:
        for line in lines:
            yield line[:-1] if line.endswith("\n") else line


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write each line plus "\\n"; returns how many."""
    count = 0
    with open_for_writing(path) as out:
        for line in lines:
            out.write(line + "\n")
            count += 1
    return count


def open_for_writing(path: Path):
    return open(path, "w", encoding="utf-8", errors="surrogateescape", newline="\n")


def count_lines(path: Path) -> int:
    with open(path, "rb") as lines:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: lines.read(1 << 20), b""))


def parallel_map(function: Callable, items: Iterable, workers: int) -> Iterator:
    """``map`` in order over ``workers`` processes (plain ``map`` for one); ``function`` must pickle."""
    if workers <= 1:
        yield from map(function, items)
        return
    with multiprocessing.Pool(workers) as pool:
        yield from pool.imap(function, items, chunksize=1000)


def read_pairs(source: Path, target: Path) -> Iterator[Tuple[str, str]]:
    """The lines of two parallel files side by side; a length mismatch is the user's corpus, not a bug."""
    for source_line, target_line in itertools.zip_longest(read_lines(source), read_lines(target)):
        if source_line is None or target_line is None:
            raise DataPrepError(f"{source} and {target} differ in length: the two sides do not match")
        yield source_line, target_line
