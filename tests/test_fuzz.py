"""The decode + validate fuzz target (fuzz/fuzz_decode_validate.py).

Without atheris the target runs over a corpus of hostile inputs; with atheris installed
(``pip install -e '.[fuzz]'``) a short coverage-guided run follows in a subprocess. The
longer run is described in docs/security.md.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolrelay.jsonlimits import decode_arguments

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fuzz" / "fuzz_decode_validate.py"
CORPUS = ROOT / "fuzz" / "corpus"
DICTIONARY = ROOT / "fuzz" / "decode_validate.dict"


def load_target() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_decode_validate", TARGET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def target() -> Any:
    return load_target()


PAYLOADS: list[bytes] = [
    b"",
    b"   \n\t",
    b"{}",
    b'{"city": "Oslo", "days": 3}',
    b'{"city": "Oslo", "days": 3, "tags": ["a", "a"]}',
    b'{"city": "", "days": 0, "ratio": 0}',
    b'{"opts": {"metric": "yes"}, "mode": 2, "flag": false}',
    b'{"either": [1, 2], "nested": {"child": {"child": {"v": 1.5}}}}',
    b'{"extra": 1.0, "other": null, "third": "x"}',
    b'{"days": 1e2, "ratio": 5e-324}',
    b'{"days": 9007199254740993, "big": ' + b"9" * 4300 + b"}",
    b'{"big": ' + b"9" * 4301 + b"}",
    b'{"ratio": NaN}',
    b'{"ratio": -Infinity}',
    b'{"ratio": 1e999}',
    b'{"city": "a", "city": "b"}',
    b'{"\\u0063ity": "a", "city": "b"}',  # the same key, spelled differently
    b'{"city": "\\ud800"}',
    b'{"city": "\\udfff\\ud800", "tags": ["\\ud83d"]}',
    b'{"\\ud800": 1}',
    b'{"city": "\xed\xa0\x80"}',
    b'{"city": "\xc0\x80"}',
    b"\xef\xbb\xbf{}",
    b"\xff\xfe{\x00}\x00",
    b'{"city": "\\u0000\\u001f"}',
    b'{"a": ' + b"[" * 70 + b"]" * 70 + b"}",
    b"[" * 5000,
    b"{" * 5000,
    b'{"a": ' * 100 + b"1" + b"}" * 100,
    b"[]",
    b'"{}"',
    b"null",
    b"1",
    b"{,}",
    b'{"a": 1,}',
    b"{'a': 1}",
    b'{"a": 01}',
    b'{"a": .5}',
    b'{"a": "x" } trailing',
    b'{"city": "' + b"x" * 2000 + b'"}',
    '{"city": "\u00e9\u20ac\U0001f600"}'.encode(),
]


def hostile_inputs(target: Any) -> Iterator[bytes]:
    """Every payload in every form and under every size and depth limit, plus the seeds."""
    forms, sizes, depths = range(6), range(len(target.SIZES)), range(len(target.DEPTHS))
    for payload, form, size, depth in itertools.product(PAYLOADS, forms, sizes, depths):
        yield bytes([form, size, depth]) + payload
    for seed in sorted(CORPUS.iterdir()):
        yield seed.read_bytes()
    yield b""
    yield b"\x00"
    yield b"\x05\x03"


def run_corpus(target: Any) -> int:
    count = 0
    for data in hostile_inputs(target):
        target.check_one(data)
        count += 1
    return count


def test_the_target_holds_over_a_hostile_corpus(target: Any) -> None:
    reached = 0
    original = target.check_validate

    def counting(args: Any) -> None:
        nonlocal reached
        reached += 1
        original(args)

    target.check_validate = counting
    try:
        count = run_corpus(target)
    finally:
        target.check_validate = original
    assert count > 4500
    assert reached > count // 4  # the validator really was exercised, not just decode


Sabotage = Callable[[Any, int, int], Any]


def _accepts_nan(raw: Any, max_bytes: int, max_depth: int) -> Any:
    if isinstance(raw, bytes | str) and b"NaN" in (raw if isinstance(raw, bytes) else b""):
        return {"ratio": float("nan")}
    return decode_arguments(raw, max_bytes, max_depth)


def _ignores_the_size_cap(raw: Any, max_bytes: int, max_depth: int) -> Any:
    return decode_arguments(raw, 1 << 30, max_depth)


def _multi_line_reason(raw: Any, max_bytes: int, max_depth: int) -> Any:
    result = decode_arguments(raw, max_bytes, max_depth)
    return result + "\nTraceback (most recent call last)" if isinstance(result, str) else result


def _last_duplicate_wins(raw: Any, max_bytes: int, max_depth: int) -> Any:
    result = decode_arguments(raw, max_bytes, max_depth)
    if isinstance(result, str) and "appears twice" in result:
        text = raw.decode() if isinstance(raw, bytes | bytearray) else raw
        return json.loads(text)
    return result


def _raises(raw: Any, max_bytes: int, max_depth: int) -> Any:
    if isinstance(raw, bytes) and raw.startswith(b"["):
        raise RecursionError
    return decode_arguments(raw, max_bytes, max_depth)


@pytest.mark.parametrize(
    "sabotage",
    [_accepts_nan, _ignores_the_size_cap, _multi_line_reason, _last_duplicate_wins, _raises],
)
def test_the_target_catches_a_broken_decoder(target: Any, sabotage: Sabotage) -> None:
    """The invariants are live: a decoder broken in any of these ways is caught."""
    target.decode_arguments = sabotage
    try:
        with pytest.raises((AssertionError, RecursionError)):
            run_corpus(target)
    finally:
        target.decode_arguments = decode_arguments


def test_the_target_catches_a_validator_that_raises_something_undocumented(
    target: Any,
) -> None:
    class Broken:
        def is_valid(self, instance: Any) -> bool:
            raise KeyError("undocumented")

    original = target.VALIDATOR
    target.VALIDATOR = Broken()
    try:
        with pytest.raises(KeyError):
            target.check_one(b"\x03\x03\x04{}")
    finally:
        target.VALIDATOR = original


def _atheris_installed() -> bool:
    return importlib.util.find_spec("atheris") is not None


@pytest.mark.skipif(
    not _atheris_installed(), reason="atheris is not installed (pip install -e '.[fuzz]')"
)
def test_a_short_atheris_run_finds_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    python_path = os.environ.get("PYTHONPATH", "")
    command = [
        sys.executable,
        str(TARGET),
        "-runs=30000",
        "-seed=1",
        "-timeout=10",
        f"-dict={DICTIONARY}",
        f"-artifact_prefix={tmp_path}/",
        str(corpus),  # new inputs go here, not into the repository
        str(CORPUS),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), python_path])},
        check=False,
    )
    log = done.stderr[-3000:]
    assert done.returncode == 0, log
    assert "Done 30000 runs" in done.stderr, log
    assert not list(tmp_path.glob("crash-*")), log


def test_depth_verdict_does_not_depend_on_unrelated_brackets() -> None:
    inner = "[" * 63 + "1" + "]" * 63  # 64 containers deep with the top object
    alone = decode_arguments('{"a": ' + inner + "}", 1 << 20, 64)
    with_sibling = decode_arguments('{"a": ' + inner + ', "b": []}', 1 << 20, 64)
    as_mapping = decode_arguments(json.loads('{"a": ' + inner + "}"), 1 << 20, 64)
    verdicts = {type(alone), type(with_sibling), type(as_mapping)}
    assert len(verdicts) == 1, (alone, with_sibling, as_mapping)
