"""Prompts from a file or a built-in set (``--data.prompts PATH_OR_NAME``), checked as they load."""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
from collections import Counter
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from lightning.pytorch.utilities import rank_zero_warn

from ..common.errors import explain_os_error
from ..common.files import MiB, read_limited
from ..common.text import check_prompt, cut_prompts

SUFFIXES = {
    ".txt": "one prompt per line",
    ".jsonl": "one JSON object with a 'prompt' field per line",
    ".csv": "a header row with a 'prompt' column",
}
#: the largest prompt file read (a million 100-character prompts fit)
MAX_PROMPT_FILE_BYTES = 256 * MiB
#: the most lines of a prompt file read: more than any run draws (10,000 iterations of 64 prompts are 640,000), and
#: counted on the bytes before anything is parsed (20 million short lines took 240 s and 5.6 GB to parse)
MAX_PROMPT_LINES = 2_000_000
_BUILTIN_PACKAGE = "lit_treegrpo.data"
_BUILTIN_FOLDER = "prompts"


class PromptSet(NamedTuple):
    """Prompts loaded from one source, in file order, with their metadata."""

    prompts: list[str]
    metadata: list[dict[str, Any]]

    def fingerprint(self) -> str:
        """sha256 of the prompts and metadata; changes when any prompt, field or the order does."""
        payload = json.dumps([self.prompts, self.metadata], sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def available_prompt_sets() -> list[str]:
    """Names of the built-in prompt sets, usable as ``--data.prompts NAME``."""
    folder = resources.files(_BUILTIN_PACKAGE).joinpath(_BUILTIN_FOLDER)
    return sorted(entry.name[: -len(".txt")] for entry in folder.iterdir() if entry.name.endswith(".txt"))


def load_prompts(source: str, *, option: str = "--data.prompts") -> PromptSet:
    """Load prompts from a ``.txt`` / ``.jsonl`` / ``.csv`` file or a built-in set name."""
    path = Path(source).expanduser()
    if path.is_file():
        name, suffix = str(path), path.suffix.lower()
        if suffix not in SUFFIXES:
            supported = "; ".join(f"{ext} ({what})" for ext, what in SUFFIXES.items())
            raise ValueError(f"{option}: {name} has the unsupported extension '{path.suffix}'; use one of {supported}")
        try:
            data = read_limited(path, MAX_PROMPT_FILE_BYTES, option)
        except OSError as err:  # permissions, an I/O error, a file that vanished
            raise ValueError(f"{option}: cannot read {name}: {explain_os_error(err)}") from err
    elif source in available_prompt_sets():
        name, suffix = f"built-in set '{source}'", ".txt"
        data = resources.files(_BUILTIN_PACKAGE).joinpath(_BUILTIN_FOLDER, f"{source}.txt").read_bytes()
    else:
        builtins = available_prompt_sets()
        close = difflib.get_close_matches(source, builtins, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        what = "a directory, " if path.is_dir() else ""
        raise FileNotFoundError(
            f"{option}: '{source}' is {what}neither a file nor a built-in prompt set{hint}; pass the path "
            f"of a {'/'.join(SUFFIXES)} file or one of the built-in sets: {', '.join(builtins)}"
        )
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if lines > MAX_PROMPT_LINES:
        raise ValueError(
            f"{option}: {name} has {lines:,} lines, more than the {MAX_PROMPT_LINES:,} this project reads of a prompt "
            f"file (more than any run draws); give a sample of it (e.g. shuf -n {MAX_PROMPT_LINES} FILE > sample.txt)"
        )
    text = _decode(data, name, option)
    parse = {".txt": _parse_txt, ".jsonl": _parse_jsonl, ".csv": _parse_csv}[suffix]
    prompt_set = parse(text, name, option)
    if not prompt_set.prompts:
        raise ValueError(f"{option}: {name} has a header but no prompt rows; add one row per prompt")
    prompt_set = PromptSet(cut_prompts(prompt_set.prompts, f"{option}: {name}"), prompt_set.metadata)
    counts = Counter(prompt_set.prompts)
    repeated = {prompt: n for prompt, n in counts.items() if n > 1}
    if repeated:
        example, n = next(iter(repeated.items()))
        rank_zero_warn(
            f"{option}: {len(repeated)} prompt(s) of {name} occur more than once (e.g. {example!r} x{n}); "
            "duplicates are kept, so such a prompt is trained on once per copy in every pass"
        )
    return prompt_set


def _decode(data: bytes, name: str, option: str) -> str:
    if not data:
        raise ValueError(f"{option}: {name} is empty; put at least one prompt in it")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark, as some editors write
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{option}: {name} is not UTF-8 text: line {line} has the byte 0x{data[err.start]:02x}; "
            "re-save the file as UTF-8"
        ) from None
    if not text.strip():
        raise ValueError(f"{option}: {name} contains only blank lines; put at least one prompt in it")
    return text


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its end) for every line that is not blank."""
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            yield number, line


def _parse_txt(text: str, name: str, option: str) -> PromptSet:
    prompts = [check_prompt(line.strip(), f"{option}: {name} line {number}") for number, line in _lines(text)]
    return PromptSet(prompts, [{} for _ in prompts])


def _parse_jsonl(text: str, name: str, option: str) -> PromptSet:
    prompts: list[str] = []
    metadata: list[dict[str, Any]] = []
    for number, line in _lines(text):
        where = f"{option}: {name} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{where} is not valid JSON ({err.msg}); each line must be one object like "
                '{"prompt": "a photo of a cat"}'
            ) from None
        except RecursionError:
            raise ValueError(
                f"{where} nests arrays or objects deeper than the JSON parser can follow; each line "
                'must be one flat object like {"prompt": "a photo of a cat"}'
            ) from None
        if not isinstance(record, dict):
            kind = type(record).__name__
            raise ValueError(f"{where} is a JSON {kind}, not an object with a 'prompt' field")
        if "prompt" not in record:
            fields = ", ".join(repr(key) for key in record) or "none"
            raise ValueError(f"{where} has no 'prompt' field (fields: {fields}); add one to every line")
        prompt = record.pop("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: 'prompt' must be a non-empty string, got {prompt!r}")
        prompts.append(check_prompt(prompt.strip(), where))
        metadata.append(record)
    return PromptSet(prompts, metadata)


def _csv_rows(text: str, name: str, option: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, row) of a CSV text; the csv module's errors (a field over its size limit, a
    quote left open) in one line naming the line."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise ValueError(
                f"{option}: {name} line {reader.line_num} cannot be read as CSV ({err}); fix that line"
            ) from None
        yield reader.line_num, row


def _parse_csv(text: str, name: str, option: str) -> PromptSet:
    reader = _csv_rows(text, name, option)
    header = [column.strip() for column in next(row for _, row in reader if any(cell.strip() for cell in row))]
    if "prompt" not in header:
        raise ValueError(
            f"{option}: {name} has no 'prompt' column (columns: {', '.join(map(repr, header))}); "
            "name the column of prompts 'prompt' in the header row"
        )
    column = header.index("prompt")
    prompts: list[str] = []
    metadata: list[dict[str, Any]] = []
    for line, row in reader:
        if not any(cell.strip() for cell in row):
            continue
        where = f"{option}: {name} line {line}"
        if len(row) != len(header):
            raise ValueError(
                f"{where} has {len(row)} fields but the header has {len(header)}; quote fields with commas"
            )
        if not row[column].strip():
            raise ValueError(f"{where} has an empty prompt")
        prompts.append(check_prompt(row[column].strip(), where))
        metadata.append({key: value for i, (key, value) in enumerate(zip(header, row)) if i != column})
    return PromptSet(prompts, metadata)
