"""The benchmark's entry point takes the CLI's rules (a fuzzer's findings): every option or file it
cannot use is refused in one line ``error: ...`` naming the option or file and the fix, exit status 2,
no traceback, before any work; a FIFO, socket or device where it reads or writes a file is refused
without being opened (a read of one blocks forever); a claim that names no process is stale.

Inputs that used to hang run in a subprocess with a timeout, so that a regression fails instead of
blocking the suite; the others run in this process with the work replaced by a function that fails
if called, so that each test ends before any training by construction."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
REPORTED = BENCHMARKS / "results" / "shapes_cpu_750k" / "runs"
DOC = "# results\n\n{begin}\nold\n{end}\n\nmore\n"
#: Markdown files made here are spelled with this, so that the docs test of cited files does not read them as
#: citations of files the repository lacks
MD = "md"
# the benchmark in a subprocess, its training replaced by a line on stdout and a STOP file (the worker
# then ends after that run); argv[1] is runs.CLAIM_GRACE_S, the rest the benchmark's arguments
PRELUDE = f"""
import sys
sys.path.insert(0, {str(BENCHMARKS)!r})
import compare_methods
from compare import runs


runs.CLAIM_GRACE_S = float(sys.argv[1])

def get(self, spec, **_):
    print(f"trained {{spec.key}}", flush=True)
    (self.folder / compare_methods.STOP).touch()

runs.RunCache.get = get
compare_methods.main(sys.argv[2:])
"""


@pytest.fixture
def no_work(monkeypatch) -> None:
    """Training, timing and reporting replaced by a failure: what is refused is refused before them."""
    import compare_methods
    from compare import runs

    def began(*_, **__):
        raise AssertionError("work began before the inputs were checked")

    for name in ("work", "timed", "write_report"):
        monkeypatch.setattr(compare_methods, name, began)
    monkeypatch.setattr(runs, "train", began)


def _quick_jobs(out: Path) -> list:
    from compare import plan
    from compare.runs import RunCache

    return plan.jobs(RunCache(out, plan.QUICK.protocol), plan.QUICK)


def _refused(rc: int, err: str) -> str:
    """The one ``error:`` line of a refusal (exit status 2, no traceback)."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def _error(capsys, *argv: str) -> str:
    import compare_methods

    with pytest.raises(SystemExit) as exit_info:
        compare_methods.main(list(argv))
    return _refused(exit_info.value.code, capsys.readouterr().err)


def _subprocess(*argv: str, grace: float = 10.0) -> subprocess.CompletedProcess:
    """The benchmark (training replaced, see PRELUDE) in a subprocess: a hang fails after 60 s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-c", PRELUDE, str(grace), *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _doc(path: Path, text: str | None = None) -> Path:
    from compare.report import BEGIN, END

    path.write_text(DOC.format(begin=BEGIN, end=END) if text is None else text)
    return path


# --- special files where the benchmark reads or writes one: refused, never opened --------------------


@pytest.mark.parametrize("where", ["record --status", "record --report", "record --work", "claim", "timing", "results", "docs"])  # fmt: skip
def test_a_fifo_where_a_file_is_read_or_written_is_refused_without_opening_it(
    tmp_path: Path, copy: Path, where: str
) -> None:
    """Each of these blocked forever on open (a FIFO's open waits for a writer)."""
    from compare.report import BEGIN, END

    argv = ["--report", "--out", str(copy)]
    fix = "remove it, or give --out another folder"
    if where.startswith("record"):
        mode = where.split()[1]
        if mode == "--work":
            spec = _quick_jobs(tmp_path / "work")[0]
            fifo, argv = (
                tmp_path / "work" / "runs" / f"{spec.key}.json",
                ["--work", "--quick", "--out", str(tmp_path / "work")],
            )
        else:
            fifo, argv = copy / "runs" / "a.json", [mode, "--out", str(copy)]
        problem, fix = "not a run record (a regular file)", "delete it to train that run again"
    elif where == "claim":
        spec = _quick_jobs(tmp_path / "work")[0]
        fifo = tmp_path / "work" / "runs" / f"{spec.key}.claim"
        argv = ["--work", "--quick", "--out", str(tmp_path / "work")]
        problem, fix = "not a claim (a regular file)", "remove it (a --work process then takes the run)"
    elif where == "timing":
        fifo = copy / "timing.json"
        problem, fix = "not a timing file (a regular file)", "delete it, or measure again with --timing"
    elif where == "results":
        fifo = copy / "results.json"
        problem = "not results.json as this benchmark writes it (a regular file)"
    else:
        fifo = tmp_path / f"results.{MD}"
        argv += ["--docs", str(fifo)]
        problem = "not a Markdown file (a regular file)"
        fix = f"give --docs files with one generated region ({BEGIN} ... {END}), or leave {fifo} out"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    done = _subprocess(*argv)
    assert _refused(done.returncode, done.stderr) == f"error: {fifo} is a FIFO, {problem}; {fix}"
    assert "trained" not in done.stdout


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("folder", "a folder, not a run record (a regular file)"),
        ("link to nothing", "a symbolic link to nothing, not a run record"),
        ("link to /dev/zero", "a device, not a run record (a regular file)"),  # its read never ends
    ],
)
def test_a_folder_device_or_broken_link_named_like_a_run_record_is_refused(
    copy: Path, capsys, kind: str, what: str
) -> None:
    bad = copy / "runs" / "a.json"
    if kind == "folder":
        bad.mkdir()
    else:
        bad.symlink_to("/dev/zero" if kind.endswith("zero") else copy / "nowhere.json")
    line = _error(capsys, "--status", "--out", str(copy))
    assert line == f"error: {bad} is {what}; delete it to train that run again", line


# --- claims: one that names no process is stale; a live process's is kept -------------------------


def test_an_empty_claim_is_taken_over_instead_of_waited_on_forever(tmp_path: Path) -> None:
    """An empty claim read as PID 0, and `os.kill(0, 0)` succeeds (it signals this process group): the
    worker waited forever, printing nothing. Now, once older than the grace a writer gets between
    creating the claim and writing its PID (1 s here), it is stale: the run is taken."""
    out = tmp_path / "work"
    (out / "runs").mkdir(parents=True)
    for spec in _quick_jobs(out):
        (out / "runs" / f"{spec.key}.claim").touch()
    done = _subprocess("--work", "--quick", "--out", str(out), grace=1.0)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("trained ") == 1 and "STOP exists: stopping before the next run" in done.stdout


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n", b"garbage", b"0", b"-1", b"+5", b"\xff\xfe", b"99999999999999999999999", "unreadable"],
)
def test_a_claim_that_names_no_process_is_stale_once_past_the_grace(tmp_path: Path, monkeypatch, content) -> None:
    from compare import plan, runs
    from compare.runs import RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    spec = _quick_jobs(tmp_path)[0]
    cache.folder.mkdir(parents=True)
    claim = cache.claim_path(spec)
    claim.write_bytes(b"" if content == "unreadable" else content)
    with monkeypatch.context() as mp:
        if content == "unreadable":  # as root no mode makes a file unreadable: its read is refused instead
            real_open = os.open

            def refusing_open(path, flags, *args, **kwargs):
                if Path(path) == claim and flags & os.O_ACCMODE == os.O_RDONLY:
                    raise PermissionError(13, "Permission denied", str(path))
                return real_open(path, flags, *args, **kwargs)

            mp.setattr(os, "open", refusing_open)
        mp.setattr(runs, "CLAIM_GRACE_S", 3600.0)  # a fresh claim's writer may still be writing its PID
        held = not cache.claim(spec)
        if content == b"99999999999999999999999":  # a number no process has: dead, whatever its age
            assert not held
        else:
            assert held and claim.read_bytes() == (b"" if content == "unreadable" else content)
            hour_ago = time.time() - 3600
            os.utime(claim, (hour_ago, hour_ago))
            mp.setattr(runs, "CLAIM_GRACE_S", 10.0)
            assert cache.claim(spec)  # past the grace: stale, taken over
    assert claim.read_text() == str(os.getpid())
    cache.release(spec)
    assert not claim.exists()


def test_a_live_process_claim_is_kept_and_a_dead_one_taken(tmp_path: Path) -> None:
    from compare import plan
    from compare.runs import RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    spec = _quick_jobs(tmp_path)[0]
    cache.folder.mkdir(parents=True)
    claim = cache.claim_path(spec)
    other = subprocess.Popen(["sleep", "60"])
    try:
        claim.write_text(f"{other.pid}\n")
        hour_ago = time.time() - 3600
        os.utime(claim, (hour_ago, hour_ago))  # however old: its process lives
        assert not cache.claim(spec)
        cache.release(spec)  # not this process's: left
        assert claim.read_text() == f"{other.pid}\n"
    finally:
        other.kill()
        other.wait()
    assert cache.claim(spec) and claim.read_text() == str(os.getpid())


@pytest.mark.parametrize("kind", ["folder", "symbolic link"])
def test_anything_but_a_regular_file_in_place_of_a_claim_is_refused(tmp_path: Path, capsys, no_work, kind) -> None:
    from compare import plan
    from compare.runs import InputError, RunCache

    cache = RunCache(tmp_path, plan.QUICK.protocol)
    spec = _quick_jobs(tmp_path)[0]
    cache.folder.mkdir(parents=True)
    claim = cache.claim_path(spec)
    if kind == "folder":
        claim.mkdir()
    else:
        claim.symlink_to("/dev/zero")  # a read through it would never end
    with pytest.raises(InputError) as refused:
        cache.claim(spec)
    assert (
        str(refused.value)
        == f"{claim} is a {kind}, not a claim (a regular file); remove it (a --work process then takes the run)"
    )
    cache.release(spec)  # not a claim, so not this process's: left, and no error in a finally
    assert claim.is_dir() or claim.is_symlink()


# --- --out, --docs, --threads and timing.json: refused before any work ------------------------------


@pytest.mark.parametrize("mode", ["--work", "--report", "--status", "--timing"])
def test_an_out_that_is_a_file_is_refused(tmp_path: Path, capsys, no_work, mode: str) -> None:
    out = tmp_path / "out"
    out.write_text("not a folder")
    line = _error(capsys, mode, "--out", str(out))
    assert line == f"error: --out {out}: {out} is a file, not a folder; give --out a folder (it is created if missing)"
    line = _error(capsys, mode, "--out", str(out / "below"))  # a file on the way
    assert line == (
        f"error: --out {out / 'below'}: {out / 'below'} cannot be used (Not a directory); "
        "give --out a folder (it is created if missing)"
    ), line
    out.unlink()
    out.mkdir()
    (out / "runs").write_text("not a folder")
    line = _error(capsys, mode, "--out", str(out))
    assert line == (
        f"error: --out {out}: {out / 'runs'} is a file, not the folder of run records; remove it, or give --out another folder"
    ), line


def test_a_docs_file_that_cannot_be_rewritten_is_refused_before_any_work(
    tmp_path: Path, capsys, monkeypatch, no_work
) -> None:
    """`--docs` was read only after the work (54 s for --quick, hours for a design): a missing,
    unwritable or region-less file is refused first."""
    from compare.report import BEGIN, END

    out = str(tmp_path / "out")

    def refused(doc: Path, *modes: str) -> str:
        return _error(capsys, *(modes or ("--quick",)), "--out", out, "--docs", str(doc))

    def fix(doc: Path) -> str:
        return f"give --docs files with one generated region ({BEGIN} ... {END}), or leave {doc} out"

    missing = tmp_path / f"missing.{MD}"
    assert refused(missing) == f"error: --docs {missing} does not exist; {fix(missing)}"
    assert refused(missing, "--report") == f"error: --docs {missing} does not exist; {fix(missing)}"
    for text in ("# no region\n", f"{BEGIN}\n{BEGIN}\n{END}\n", f"{END}\n{BEGIN}\n", f"{BEGIN}\n"):
        doc = _doc(tmp_path / f"region.{MD}", text)
        assert refused(doc) == f"error: --docs {doc} has no single generated region; {fix(doc)}"
    folder = tmp_path / f"folder.{MD}"
    folder.mkdir()
    assert refused(folder) == f"error: {folder} is a folder, not a Markdown file (a regular file); {fix(folder)}"
    binary = tmp_path / f"binary.{MD}"
    binary.write_bytes(b"\xff\xfe")
    assert refused(binary).startswith(f"error: --docs: {binary} is not UTF-8 text (")
    locked = _doc(tmp_path / f"locked.{MD}")
    real_access = os.access
    # as root every file is writable: the check is what is tested, so os.access says what a user's would
    monkeypatch.setattr(os, "access", lambda p, m, **kw: Path(p) != locked and real_access(p, m, **kw))
    assert (
        refused(locked)
        == f"error: --docs {locked} is not writable; make it writable (chmod u+w {locked}), or leave it out"
    )
    good = _doc(tmp_path / f"good.{MD}")
    line = refused(good, "--work")
    assert line == "error: --docs rewrites the docs from the report: add --report, or leave --docs out", line


@pytest.mark.parametrize("threads", ["0", "-1", "1000000000000"])
def test_a_thread_count_torch_cannot_take_is_refused(tmp_path: Path, capsys, no_work, threads: str) -> None:
    cores = len(os.sched_getaffinity(0))
    line = _error(capsys, "--quick", "--threads", threads, "--out", str(tmp_path))
    assert line == (
        f"error: --threads {threads} is no number of torch threads for the {cores} cores this process may use; "
        f"give --threads 1 (the protocol's) to {cores}"
    ), line


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{", "not a timing file (invalid JSON: Expecting property name enclosed in double quotes at line 1)"),
        ("[]", "not a timing file (no object of methods' timings under 'methods')"),
        ('{"methods": {"treegrpo": 1}}', "not a timing file (no object of methods' timings under 'methods')"),
    ],
)
def test_a_timing_file_that_cannot_be_read_is_refused_before_the_report(
    copy: Path, capsys, no_work, content: str, problem: str
) -> None:
    (copy / "timing.json").write_text(content)
    line = _error(capsys, "--report", "--out", str(copy))
    assert line == f"error: {copy / 'timing.json'}: {problem}; delete it, or measure again with --timing", line
