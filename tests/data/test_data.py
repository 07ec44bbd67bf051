"""Prompt loading, the train / validation split, the stateless data-parallel stream, resume checks
and the DataLoader / Trainer integration of :mod:`lit_treegrpo.data`."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning import LightningModule, Trainer
from torch.utils.data import DataLoader

from lit_treegrpo.data import prompt_sets
from lit_treegrpo.data.datamodule import PromptDataModule, resolve_batch_size
from lit_treegrpo.data.prompt_sets import PromptSet, available_prompt_sets, load_prompts
from lit_treegrpo.data.prompt_stream import PromptBatch, PromptStream, collate, eval_batches, prompt_permutation
from lit_treegrpo.shapes import world

COLOURS = list(world.COLOURS)
SHAPES = list(world.SHAPES)


def numbered(n: int) -> PromptSet:
    return PromptSet([f"prompt {i}" for i in range(n)], [{"id": i} for i in range(n)])


def write(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(path)


def stream_indices(stream: PromptStream, steps: range) -> list[list[int]]:
    return [stream.indices(k) for k in steps]


# -- loading ------------------------------------------------------------------------------------


def test_txt_strips_whitespace_skips_blank_lines_and_byte_order_mark(tmp_path: Path) -> None:
    path = write(tmp_path / "p.txt", b"\xef\xbb\xbf  a cat \r\n\n   \n\ta dog\r\n" + "un café\n".encode())
    loaded = load_prompts(path)
    assert loaded.prompts == ["a cat", "a dog", "un café"]
    assert loaded.metadata == [{}, {}, {}]


def test_jsonl_keeps_other_fields_as_metadata(tmp_path: Path) -> None:
    lines = [
        json.dumps({"prompt": " a red fox ", "category": "animal", "tags": ["snow"], "id": 7}),
        "",
        json.dumps({"id": 8, "prompt": "a castle"}),
    ]
    loaded = load_prompts(write(tmp_path / "p.jsonl", "\n".join(lines) + "\n"))
    assert loaded.prompts == ["a red fox", "a castle"]
    assert loaded.metadata == [{"category": "animal", "tags": ["snow"], "id": 7}, {"id": 8}]


def test_csv_prompt_column_anywhere_other_columns_metadata(tmp_path: Path) -> None:
    text = 'id, prompt ,style\n1,"a cat, sleeping",photo\n\n2,a dog,anime\n'
    loaded = load_prompts(write(tmp_path / "p.csv", text))
    assert loaded.prompts == ["a cat, sleeping", "a dog"]
    assert loaded.metadata == [{"id": "1", "style": "photo"}, {"id": "2", "style": "anime"}]


def test_builtin_sets_sizes_and_contents() -> None:
    assert available_prompt_sets() == ["animals", "hpdv2_style", "shapes", "shapes_world"]

    shapes = load_prompts("shapes")
    # exactly the 24 colour x shape combinations, phrased "a {colour} {shape}" ("an orange ..."), each once
    assert sorted(shapes.prompts) == sorted(
        f"{'an' if c == 'orange' else 'a'} {c} {s}" for c in COLOURS for s in SHAPES
    )
    assert len(shapes.prompts) == 24
    # the whole grammar of the Shapes world, in the grammar's order
    assert load_prompts("shapes_world").prompts == world.all_prompts()

    animals = load_prompts("animals")
    assert len(animals.prompts) == len(set(animals.prompts)) == 100

    hpd = load_prompts("hpdv2_style")
    assert len(hpd.prompts) == len(set(hpd.prompts)) == 300
    # four styles, 75 prompts each, every prompt naming its style
    for style in ("photo", "anime", "concept art", "painting"):
        assert sum(style in p for p in hpd.prompts) >= 75, style
    assert all(any(s in p for s in ("photo", "anime", "concept art", "painting")) for p in hpd.prompts)
    assert all(p == p.strip() and p for s in (shapes, animals, hpd) for p in s.prompts)


def test_datamodule_loads_builtin_set_by_name() -> None:
    dm = PromptDataModule("animals", val_fraction=0.0)
    assert dm.train_set.prompts == load_prompts("animals").prompts
    assert dm.val_dataloader() == []  # no validation prompts -> Lightning skips validation


def test_duplicates_are_kept_and_warned_once(tmp_path: Path) -> None:
    path = write(tmp_path / "p.txt", "a cat\na dog\na cat\na cat\n")
    message = r"--data\.prompts: 1 prompt\(s\) .* more than once .*'a cat' x3"
    with pytest.warns(UserWarning, match=message) as record:
        loaded = load_prompts(path)
    assert len([w for w in record if "more than once" in str(w.message)]) == 1
    assert loaded.prompts == ["a cat", "a dog", "a cat", "a cat"]


# -- bad input ----------------------------------------------------------------------------------

# file name, content, what the message must say (every message starts with the option it names)
BAD_FILES = [
    ("empty.txt", b"", r"empty\.txt is empty; put at least one prompt"),
    ("blank.txt", b"\n  \n\t\n", r"blank\.txt contains only blank lines"),
    ("latin1.txt", b"a cat\na dog\nun caf\xe9\n", r"not UTF-8 text: line 3 has the byte 0xe9; re-save"),
    ("bad.jsonl", b'{"prompt": "a cat"}\n{"prompt": "a dog"\n', r"bad\.jsonl line 2 is not valid JSON"),
    ("noprompt.jsonl", b'{"prompt": "a"}\n\n{"text": "b"}', r"line 3 has no 'prompt' field \(fields: 'text'"),
    ("list.jsonl", b'["a cat"]\n', r"line 1 is a JSON list, not an object"),
    ("emptyprompt.jsonl", b'{"prompt": "  "}\n', r"line 1: 'prompt' must be a non-empty string"),
    ("nocol.csv", b"text,style\na cat,photo\n", r"has no 'prompt' column \(columns: 'text', 'style'\)"),
    ("header.csv", b"prompt,style\n", r"has a header but no prompt rows"),
    ("ragged.csv", b"prompt,style\na cat,photo,extra\n", r"line 2 has 3 fields but the header has 2"),
    ("prompts.json", b'[{"prompt": "a"}]', r"unsupported extension '\.json'; use one of \.txt .*\.csv"),
    ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", r"deep\.jsonl line 1 nests arrays or objects deeper than"),
]


@pytest.mark.parametrize(("name", "data", "message"), BAD_FILES, ids=[n for n, _, _ in BAD_FILES])
def test_bad_prompt_files_name_the_option_and_the_fix(tmp_path: Path, name: str, data: bytes, message: str):
    path = write(tmp_path / name, data)
    with pytest.raises(ValueError, match=r"^--data\.prompts: .*" + message):
        PromptDataModule(path)


def test_a_prompt_file_that_cannot_be_read_names_the_option_the_file_and_the_fix(tmp_path: Path, monkeypatch) -> None:
    path = Path(write(tmp_path / "p.txt", "a cat\n"))

    def unreadable(
        path: Path, limit: int, what: str
    ) -> bytes:  # as for a file without read permission (tests run as root here)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(prompt_sets, "read_limited", unreadable)
    with pytest.raises(ValueError) as raised:
        PromptDataModule(str(path))
    assert str(raised.value) == (
        f"--data.prompts: cannot read {path}: {path}: Permission denied (EACCES); check its permissions, or choose another path"
    )


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("nul.txt", b"a cat\na d\x00og\n", "nul.txt line 2: the prompt 'a d.x00og' holds the control character U\\+0000 at character 4"),
        ("esc.txt", b"a \x1b[31mred\x1b[0m cat\n", "line 1: the prompt .* holds the control character U\\+001B"),
        ("del.csv", b"prompt\na cat\x7f\n", "del.csv line 2: the prompt .* holds the control character U\\+007F"),
        ("surrogate.jsonl", b'{"prompt": "a cat"}\n{"prompt": "a \\ud800 dog"}\n', "line 2: the prompt .* holds the lone surrogate U\\+D800"),
        ("bell.jsonl", b'{"prompt": "ring\\u0007"}\n', "line 1: the prompt .* holds the control character U\\+0007"),
        ("long.csv", b"prompt\n" + b"x" * 200_000 + b"\n", "long.csv line 2 cannot be read as CSV \\(field larger than field limit"),
    ],
)  # fmt: skip
def test_prompts_must_be_printable_text_named_by_file_and_line(tmp_path: Path, name: str, data: bytes, message: str):
    path = write(tmp_path / name, data)
    with pytest.raises(ValueError, match=r"^--data\.prompts: .*" + message):
        PromptDataModule(path)


def test_printable_prompts_with_tabs_line_breaks_and_emoji_load(tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", '{"prompt": "a cat\\tsitting\\non a mat 🐈\u200d⬛"}\n{"prompt": "a dog"}\n')
    assert load_prompts(path).prompts == ["a cat\tsitting\non a mat 🐈\u200d⬛", "a dog"]


def test_a_prompt_without_line_breaks_is_cut_by_characters_before_anything_tokenises_it(
    tmp_path: Path, monkeypatch
) -> None:
    from lit_treegrpo.common.text import MAX_PROMPT_CHARS, PromptCutWarning

    path = write(tmp_path / "p.txt", "a cat " + "very " * 600_000 + "\na dog\n")  # one 3 MB line
    # the work, counted: the bytes read and the characters each prompt's check looks at
    read, checked = [], []
    read_limited, check_prompt = prompt_sets.read_limited, prompt_sets.check_prompt

    def counted_read(*args, **kwargs) -> bytes:
        read.append(len(data := read_limited(*args, **kwargs)))
        return data

    def counted_check(text: str, where: str) -> str:
        checked.append(len(text))
        return check_prompt(text, where)

    monkeypatch.setattr(prompt_sets, "read_limited", counted_read)
    monkeypatch.setattr(prompt_sets, "check_prompt", counted_check)
    with pytest.warns(PromptCutWarning) as caught:
        prompts = load_prompts(path).prompts
    # linear in the file: read once, each prompt checked once (no pass per character, no tokeniser)
    assert read == [Path(path).stat().st_size]
    assert checked == [len("a cat " + "very " * 600_000) - 1, len("a dog")]
    assert [len(p) for p in prompts] == [MAX_PROMPT_CHARS, len("a dog")] and prompts[0].startswith("a cat very")
    assert len(caught) == 1  # said once for the file
    assert str(caught[0].message).startswith(
        f"--data.prompts: {path}: 1 of 2 prompts are longer than 10,000 characters"
    )


def test_a_prompt_file_over_the_size_bound_is_refused_naming_it(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path / "p.txt", "a cat\n" * 100)
    monkeypatch.setattr(prompt_sets, "MAX_PROMPT_FILE_BYTES", 100)
    with pytest.raises(
        ValueError, match=rf"^--data\.prompts: {path} is larger than 100 bytes, the most this project reads"
    ):
        PromptDataModule(path)


def test_the_callbacks_prompts_are_checked_and_cut_where_they_enter() -> None:
    from lit_treegrpo.callbacks import SampleGridLogger, TreeView
    from lit_treegrpo.common.text import MAX_PROMPT_CHARS, PromptCutWarning

    with pytest.raises(ValueError, match=r"^SampleGridLogger.prompts\[1\]: the prompt 'a\\x00b' holds the control"):
        SampleGridLogger(prompts=["a cat", "a\x00b"])
    with pytest.raises(ValueError, match=r"^SampleGridLogger.prompts\[0\]: a prompt must be text, got int"):
        SampleGridLogger(prompts=[3])
    with pytest.raises(ValueError, match=r"^TreeView.prompt: the prompt .* holds the control character U\+001B"):
        TreeView(prompt="\x1b[2J")
    with pytest.warns(PromptCutWarning, match="^SampleGridLogger.prompts: 1 of 1 prompts are longer"):
        assert len(SampleGridLogger(prompts=["x" * 20_000]).prompts[0]) == MAX_PROMPT_CHARS


def test_missing_file_lists_builtin_sets(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.txt")
    message = r"--data\.prompts: '.*nope\.txt' is neither a file nor a built-in prompt set; .*"
    with pytest.raises(FileNotFoundError, match=message + r"built-in sets: animals, hpdv2_style, shapes, shapes_world"):
        PromptDataModule(missing)
    with pytest.raises(FileNotFoundError, match=r"did you mean 'animals'\?"):
        PromptDataModule("animal")


def test_bad_val_prompts_name_their_own_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--data\.val_prompts: .*is empty"):
        PromptDataModule("shapes", val_prompts=write(tmp_path / "v.txt", b""))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(batch_size=0), r"--data\.batch_size must be >= 1, got 0"),
        (dict(val_fraction=1.0), r"--data\.val_fraction must be in \[0, 1\), got 1\.0"),
        (dict(val_fraction=-0.1), r"--data\.val_fraction must be in \[0, 1\), got -0\.1"),
        (dict(val_size=-1), r"--data\.val_size must be >= 0 or null"),
    ],
)
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PromptDataModule("shapes", **kwargs)


# ----------------------------------------------------------------------------- global batch size
def test_global_batch_size_is_split_over_the_data_parallel_ranks() -> None:
    dm = PromptDataModule("animals", global_batch_size=8, seed=3)
    assert [dm.per_rank_batch_size(w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    ranks = [dm.train_dataset(rank=r, world_size=2) for r in range(2)]
    assert [r.batch_size for r in ranks] == [4, 4]
    same = PromptDataModule("animals", batch_size=4, seed=3)  # the per-rank spelling of the same run
    for k in range(3):
        assert [r.indices(k) for r in ranks] == [same.train_dataset(rank=r, world_size=2).indices(k) for r in range(2)]
    # neither given: 4 per rank, whatever the world size
    assert PromptDataModule("animals").per_rank_batch_size(3) == 4


@pytest.mark.parametrize(
    ("batch_size", "global_batch_size", "world", "message"),
    [
        (
            None,
            6,
            4,
            r"--data\.global_batch_size 6 is not divisible by the 4 data-parallel processes \(--trainer\.devices x "
            r"--trainer\.num_nodes\); use a multiple of 4 \(4 or 8\), or give --data\.batch_size",
        ),
        (None, 3, 8, r"use a multiple of 8 \(8\)"),
        (
            2,
            8,
            2,
            r"--data\.batch_size 2 and --data\.global_batch_size 8 disagree: 2 process\(es\) x 2 != 8; give only one",
        ),
    ],
)
def test_batch_sizes_that_do_not_divide_are_refused(batch_size, global_batch_size, world, message) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_batch_size(batch_size, global_batch_size, world)
    assert resolve_batch_size(4, 8, 2) == 4  # both given and consistent is fine


def test_setup_checks_the_global_batch_against_the_trainer_world_size(monkeypatch) -> None:
    dm = PromptDataModule("animals", global_batch_size=6)
    monkeypatch.setattr(dm, "data_parallel", lambda: (0, 4))  # as a 4-process trainer reports it
    with pytest.raises(ValueError, match="--data.global_batch_size 6 is not divisible by the 4"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="--data.global_batch_size must be >= 1"):
        PromptDataModule("animals", global_batch_size=0)


@pytest.mark.filterwarnings("ignore:.*occur more than once")
def test_no_train_prompts_left_after_hold_out(tmp_path: Path) -> None:
    path = write(tmp_path / "one.txt", "a cat\na cat\n")
    with pytest.raises(
        ValueError,
        match=r"--data\.prompts: all 1 distinct prompt\(s\) .* held out .* "
        r"set --data\.val_fraction 0 or give a separate --data\.val_prompts",
    ):
        PromptDataModule(path, val_fraction=0.05)
    # the fixes it names both work; the stream wraps around its prompts from one step to the next
    assert PromptDataModule(path, val_fraction=0.0, batch_size=1).train_dataset(1, 2).batch(3).prompts == ["a cat"]
    with_val_file = PromptDataModule(path, val_prompts="shapes", batch_size=2)
    assert with_val_file.val_set.prompts[:2] == ["a red circle", "a red square"]


@pytest.mark.parametrize(
    ("kwargs", "world", "message"),
    [
        (
            dict(batch_size=100_000_000),
            1,
            "--data.batch_size 100000000 asks for 100000000 prompts per training step, "
            "but 'shapes' has 22 training prompts after holding out 2 for validation; use --data.batch_size 22 or less",
        ),
        (
            dict(),
            1,
            "--data.batch_size 4 (the default) asks for 4 prompts per training step, but 'TWO' has 2 "
            "training prompts; use --data.batch_size 2 or less, or give more prompts",
        ),
        (
            dict(batch_size=2),
            2,
            "--data.batch_size 2 x 2 data-parallel processes asks for 4 prompts per training step, "
            "but 'TWO' has 2 training prompts; use --data.batch_size 1 or less",
        ),
        (
            dict(global_batch_size=4),
            2,
            "--data.global_batch_size 4 asks for 4 prompts per training step, but 'TWO' "
            "has 2 training prompts; use --data.global_batch_size 2 or less",
        ),
        (
            dict(batch_size=1),
            3,
            "--data.batch_size 1 x 3 data-parallel processes asks for 3 prompts per training step, "
            "but 'TWO' has 2 training prompts; use at most 2 data-parallel processes",
        ),
    ],
)
def test_a_batch_larger_than_the_training_prompts_is_refused_before_any_draw(
    tmp_path: Path, monkeypatch, kwargs, world, message
) -> None:
    two = write(tmp_path / "two.txt", "a cat\na dog\n")
    source = "shapes" if kwargs.get("batch_size") == 100_000_000 else two

    def drawn(*_):
        raise AssertionError("a prompt was drawn before the batch size was checked")

    monkeypatch.setattr(PromptStream, "position_index", drawn)  # every draw goes through it: none may
    with pytest.raises(ValueError) as raised:
        dm = PromptDataModule(source, **kwargs, **({} if source == "shapes" else {"val_fraction": 0.0}))
        dm.train_dataset(rank=0, world_size=world).batch(0)  # drawing 10^8 prompts took hours
    assert str(raised.value).replace(two, "TWO").startswith(message), str(raised.value)


# -- split --------------------------------------------------------------------------------------


def test_hold_out_size_is_deterministic_by_seed_and_capped() -> None:
    assert len(PromptDataModule("animals", val_fraction=0.05, val_size=None).val_set.prompts) == 5
    # 0.07 * 100 == 7.000000000000001 in floats: still 7 held out, not 8
    assert len(PromptDataModule("animals", val_fraction=0.07, val_size=None).val_set.prompts) == 7
    assert len(PromptDataModule("animals", val_fraction=0.5, val_size=16).val_set.prompts) == 16
    assert PromptDataModule("animals", val_fraction=0.5, val_size=0).val_set.prompts == []
    a, b = PromptDataModule("animals", seed=1), PromptDataModule("animals", seed=1)
    c = PromptDataModule("animals", seed=2)
    assert a.val_set == b.val_set and a.val_set != c.val_set
    order = load_prompts("animals").prompts  # validation prompts come in file order
    assert a.val_set.prompts == sorted(a.val_set.prompts, key=order.index)
    assert sorted(a.train_set.prompts + a.val_set.prompts) == sorted(order)


@pytest.mark.filterwarnings("ignore:.*occur more than once")
def test_held_out_prompts_never_appear_in_training(tmp_path: Path) -> None:
    # duplicates: every copy of a held-out prompt leaves training, not just one
    text = "\n".join([f"prompt {i}" for i in range(30)] * 2)
    path = write(tmp_path / "p.txt", text)
    dm = PromptDataModule(path, batch_size=4, val_fraction=0.2, val_size=None, seed=3)
    held = set(dm.val_set.prompts)
    assert len(held) == 6 and len(dm.train_set.prompts) == 48
    trained = Counter()
    for rank in (0, 1):
        for k in range(30):  # 30 steps x 8 prompts = 5 passes over the 48 training copies
            trained.update(dm.train_dataset(rank, 2).batch(k).prompts)
    assert not held & set(trained)
    assert set(trained) == set(dm.train_set.prompts)


def test_separate_val_prompts_are_capped_in_file_order_and_overlap_warned(tmp_path: Path) -> None:
    val = write(tmp_path / "v.txt", "a red circle\nsomething new\nthird\n")
    message = r"--data\.val_prompts: 1 validation prompt\(s\) are also training prompts"
    with pytest.warns(UserWarning, match=message):
        dm = PromptDataModule("shapes", val_prompts=val, val_size=2)
    assert dm.val_set.prompts == ["a red circle", "something new"]
    assert len(dm.train_set.prompts) == 24  # nothing held out of the training file


# -- stream -------------------------------------------------------------------------------------


def test_permutation_is_a_fixed_function_of_its_key() -> None:
    # Pinned: a change here changes every stream and breaks exact resume of existing checkpoints.
    assert prompt_permutation(10, "stream", 0, 0) == [7, 0, 6, 8, 5, 4, 1, 3, 2, 9]
    assert prompt_permutation(10, "stream", 0, 1) == [7, 4, 1, 2, 5, 9, 8, 3, 0, 6]
    assert prompt_permutation(10, "stream", 1, 0) == [4, 7, 9, 3, 6, 2, 1, 8, 5, 0]
    big = prompt_permutation(1000, "holdout", 5)
    assert sorted(big) == list(range(1000)) and big != list(range(1000))
    assert prompt_permutation(1, "x") == [0] and prompt_permutation(0, "x") == []


def test_stream_is_deterministic_in_seed() -> None:
    prompts = numbered(50)
    runs = [stream_indices(PromptStream(prompts, batch_size=4, seed=s), range(20)) for s in (0, 0, 1)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_ranks_split_consecutive_stream_positions() -> None:
    prompts = numbered(24)
    B, W = 3, 2
    single = PromptStream(prompts, batch_size=B * W, seed=4)  # one rank with the same global batch
    ranks = [PromptStream(prompts, batch_size=B, seed=4, rank=r, world_size=W) for r in range(W)]
    for k in range(10):
        parts = [stream.indices(k) for stream in ranks]
        assert not set(parts[0]) & set(parts[1])  # 24 % 6 == 0: a step never straddles two passes
        assert parts[0] + parts[1] == single.indices(k)
        assert parts[0] + parts[1] == [single.position_index(j) for j in range(k * B * W, (k + 1) * B * W)]


def test_each_pass_shows_every_prompt_once_in_a_fresh_order() -> None:
    prompts = numbered(24)
    ranks = [PromptStream(prompts, batch_size=3, seed=0, rank=r, world_size=2) for r in range(2)]
    steps_per_pass = 24 // 6
    orders = []
    for p in range(3):
        steps = range(p * steps_per_pass, (p + 1) * steps_per_pass)
        order = [i for k in steps for stream in ranks for i in stream.indices(k)]
        assert sorted(order) == list(range(24)), p
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]


def test_stream_wraps_when_fewer_prompts_than_a_global_batch() -> None:
    stream = PromptStream(numbered(5), batch_size=4, seed=0, rank=1, world_size=2)
    # positions 4..7 of step 0: the last of pass 0 and the first three of pass 1
    expected = [prompt_permutation(5, "stream", 0, 0)[4]] + prompt_permutation(5, "stream", 0, 1)[:3]
    assert stream.indices(0) == expected


def test_batches_carry_index_and_aligned_metadata() -> None:
    stream = PromptStream(numbered(7), batch_size=3, seed=0)
    for k, batch in zip(range(6), stream):
        assert isinstance(batch, PromptBatch) and batch.index == k
        assert [f"prompt {m['id']}" for m in batch.metadata] == batch.prompts


def test_start_index_resumes_the_same_stream() -> None:
    dm = PromptDataModule("animals", batch_size=4, seed=9)
    fresh = [b for _, b in zip(range(12), dm.train_dataloader())]
    dm.start_index = 7
    resumed = [b for _, b in zip(range(5), dm.train_dataloader())]
    assert resumed == fresh[7:12]
    assert [b.index for b in resumed] == [7, 8, 9, 10, 11]


def test_multi_worker_loader_yields_the_same_batches_in_order() -> None:
    stream = PromptStream(numbered(11), batch_size=2, seed=1, start_index=3)
    loader = DataLoader(stream, batch_size=None, collate_fn=collate, num_workers=2)
    got = [b for _, b in zip(range(6), loader)]
    assert got == [stream.batch(k) for k in range(3, 9)]


def test_rank_and_world_size_come_from_the_trainer_strategy() -> None:
    dm = PromptDataModule("animals", batch_size=2)
    assert dm.data_parallel() == (0, 1)
    dm.trainer = SimpleNamespace(distributed_sampler_kwargs={"rank": 1, "num_replicas": 3})
    assert dm.data_parallel() == (1, 3)
    stream = dm.train_dataset()
    assert (stream.rank, stream.world_size) == (1, 3)
    assert stream.batch(2) == dm.train_dataset(rank=1, world_size=3).batch(2)


# -- evaluation ---------------------------------------------------------------------------------


def test_val_chunks_are_ordered_split_and_padded_across_ranks() -> None:
    dm = PromptDataModule("animals", batch_size=4, val_fraction=0.1, val_size=None)  # 10 held out
    val = dm.val_set.prompts
    single = list(dm.val_dataloader())
    assert [b.prompts for b in single] == [val[0:4], val[4:8], val[8:10]]
    assert [b.index for b in single] == [0, 1, 2]
    assert list(dm.test_dataloader()) == single
    # two ranks: chunks 0, 2 | 1, then rank 1 repeats chunk 0 so both run 2 steps
    r0, r1 = (list(dm.val_dataset(rank=r, world_size=2)) for r in (0, 1))
    assert [b.index for b in r0] == [0, 2] and [b.index for b in r1] == [1, 0]
    assert r0[0] == single[0] and r1[0] == single[1]
    # predict: no padding, every prompt exactly once over the ranks
    p0, p1 = (list(dm.predict_dataset(rank=r, world_size=2)) for r in (0, 1))
    assert sorted(p for b in p0 + p1 for p in b.prompts) == sorted(val)


def test_eval_batches_with_more_ranks_than_chunks() -> None:
    chunks = [eval_batches(numbered(3), 2, rank=r, world_size=3) for r in range(3)]
    assert [[b.index for b in c] for c in chunks] == [[0], [1], [0]]
    assert eval_batches(numbered(3), 2, rank=2, world_size=3, pad=False) == []


# -- checkpoint ---------------------------------------------------------------------------------


def test_state_dict_accepts_the_same_data_and_rejects_other(tmp_path: Path) -> None:
    dm = PromptDataModule("shapes", seed=1)
    state = dm.state_dict()
    assert state["num_prompts"] == 24 and len(state["prompts_sha256"]) == 64
    PromptDataModule("shapes", seed=1).load_state_dict(state)
    # the same prompts from a file are the same data
    shapes = load_prompts("shapes").prompts
    PromptDataModule(write(tmp_path / "same.txt", "\n".join(shapes)), seed=1).load_state_dict(state)

    edited = write(tmp_path / "edited.txt", "\n".join(shapes[:-1] + ["a black circle"]))
    message = r"--data\.prompts: the checkpoint was trained on 24 prompts from 'shapes' \(sha256 \w{12}\), "
    with pytest.raises(ValueError, match=message + r"but '.*edited\.txt' now gives 24 prompts"):
        PromptDataModule(edited, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"--data\.prompts: .* now gives 100 prompts"):
        PromptDataModule("animals", seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"--data\.seed: the checkpoint's data seed is 1, this run's is 2"):
        PromptDataModule("shapes", seed=2).load_state_dict(state)
    message = r"--data\.val_fraction .*trained on 22 prompts .* would train on 24"
    with pytest.raises(ValueError, match=message):
        PromptDataModule("shapes", seed=1, val_fraction=0.0).load_state_dict(state)


# -- Lightning integration ----------------------------------------------------------------------


class Recorder(LightningModule):
    """Records what reaches training_step / validation_step; resumes its data position."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.iteration = 0
        self.train_batches: list[PromptBatch] = []
        self.val_batches: list[PromptBatch] = []

    def training_step(self, batch: PromptBatch, batch_idx: int) -> torch.Tensor:
        assert isinstance(batch, PromptBatch), type(batch)  # after transfer_batch_to_device
        self.train_batches.append(batch)
        self.iteration += 1
        return (self.weight * 0.0).sum()

    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        assert isinstance(batch, PromptBatch), type(batch)
        self.val_batches.append(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["iteration"] = self.iteration

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # the pattern the training module follows: the stream resumes at its own counter
        self.iteration = checkpoint["iteration"]
        self.trainer.datamodule.start_index = self.iteration


def make_trainer(root: Path, max_steps: int) -> Trainer:
    return Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        default_root_dir=root,
    )


def test_trainer_fit_resume_and_fingerprint_check(tmp_path: Path) -> None:
    lines = [json.dumps({"prompt": f"prompt {i}", "id": i}) for i in range(10)]
    path = write(tmp_path / "p.jsonl", "\n".join(lines))
    fresh = PromptDataModule(path, batch_size=2, val_fraction=0.2, seed=5).train_dataset()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")

        model, dm = Recorder(), PromptDataModule(path, batch_size=2, val_fraction=0.2, seed=5)
        trainer = make_trainer(tmp_path, max_steps=3)
        trainer.fit(model, dm)
        assert model.train_batches == [fresh.batch(k) for k in range(3)]
        # 2 prompts held out: one validation chunk, run at step 2
        assert model.val_batches == [PromptBatch(dm.val_set.prompts, 0, dm.val_set.metadata)]
        for batch in model.train_batches:  # metadata survives transfer_batch_to_device, aligned
            assert [f"prompt {m['id']}" for m in batch.metadata] == batch.prompts
        ckpt = tmp_path / "three.ckpt"
        trainer.save_checkpoint(ckpt)

        resumed = Recorder()
        dm = PromptDataModule(path, batch_size=2, val_fraction=0.2, seed=5)
        make_trainer(tmp_path, max_steps=5).fit(resumed, dm, ckpt_path=ckpt)
        assert resumed.train_batches == [fresh.batch(3), fresh.batch(4)]

        other = write(tmp_path / "other.txt", "\n".join(f"prompt {i}" for i in range(10)))
        with pytest.raises(ValueError, match=r"--data\.prompts: the checkpoint was trained on 10 prompts"):
            dm = PromptDataModule(other, batch_size=2, val_fraction=0.2, seed=5)
            make_trainer(tmp_path, max_steps=5).fit(Recorder(), dm, ckpt_path=ckpt)


def test_a_prompt_file_of_more_lines_than_the_bound_is_refused_before_parsing(tmp_path: Path, monkeypatch) -> None:
    from lit_treegrpo.data import prompt_sets

    monkeypatch.setattr(prompt_sets, "MAX_PROMPT_LINES", 3)  # the bound's logic, on a file of a few bytes
    parsed = []
    monkeypatch.setattr(prompt_sets, "_parse_txt", lambda *a: parsed.append(a))
    path = write(tmp_path / "many.txt", "a\nb\nc\nd")  # 4 lines, the last without its newline
    with pytest.raises(ValueError, match=r"^--data\.prompts: .*many\.txt has 4 lines, more than the 3 this project"):
        load_prompts(path)
    assert parsed == []  # counted on the bytes, before anything was decoded or parsed
    monkeypatch.undo()
    assert prompt_sets.MAX_PROMPT_LINES == 2_000_000
    assert load_prompts(write(tmp_path / "three.txt", "a\nb\nc\n")).prompts == ["a", "b", "c"]
