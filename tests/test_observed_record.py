"""The observation record (keying/observed.py) is data: versioned, sorted, bounded, pure."""

from __future__ import annotations

import json

import pytest

from kbuild.backend.objectmodel import NUMBA_CUDA
from kbuild.keying import observed as obs
from kbuild.keying.observed import Kind, Observation

K = "0" * 32


def _set(*rows):
    return obs.observation_set(K, [Observation(kind, name, d) for kind, name, d in rows])


def test_full_key_ignores_order_and_duplicates_but_not_digests():
    a = _set((Kind.ENV, "X", "1"), (Kind.GLOBAL, "m:A", "2"))
    b = _set((Kind.GLOBAL, "m:A", "2"), (Kind.ENV, "X", "1"), (Kind.ENV, "X", "1"))
    c = _set((Kind.GLOBAL, "m:A", "3"), (Kind.ENV, "X", "1"))
    assert a.key == b.key != c.key
    assert a.key != obs.observation_set("1" * 32, a.observations).key


def test_a_set_matches_only_while_every_digest_holds():
    record = obs.merged(None, K, _set((Kind.ENV, "X", "1"), (Kind.GLOBAL, "m:A", "2")))
    now = {(Kind.ENV, "X"): "1", (Kind.GLOBAL, "m:A"): "2"}
    assert obs.matching_set(record, lambda k, n: now[(k, n)]) is record.sets[0]
    now[(Kind.GLOBAL, "m:A")] = "9"
    assert obs.matching_set(record, lambda k, n: now[(k, n)]) is None
    assert obs.changes(record.sets[0], lambda k, n: now[(k, n)]) == \
        ["observed global m.A changed"]


def test_record_keeps_the_newest_sets_first_and_at_most_max():
    record = None
    for i in range(obs.MAX_SETS + 3):
        record = obs.merged(record, K, _set((Kind.ENV, "X", str(i))))
    assert len(record.sets) == obs.MAX_SETS
    assert record.sets[0].observations[0].digest == str(obs.MAX_SETS + 2)
    again = obs.merged(record, K, record.sets[3])
    assert again.sets[0] == record.sets[3] and len(set(s.key for s in again.sets)) == obs.MAX_SETS


def test_json_round_trip_is_sorted_and_versioned():
    record = obs.merged(None, K, _set((Kind.OVERLOAD, "m:f", "d"), (Kind.ENV, "B", "e")))
    data = obs.to_json(record)
    assert obs.from_json(data) == record
    raw = json.loads(data)
    assert raw["version"] == obs.RECORD_VERSION
    assert [r[0] for r in raw["sets"][0]["observations"]] == ["env", "overload impl"]
    raw["version"] = obs.RECORD_VERSION + 1
    assert obs.from_json(json.dumps(raw).encode()) is None
    assert obs.from_json(b"{not json") is None
    assert obs.from_json(b'{"version": 1, "static_key": "k", "sets": [{"key": "x"}]}') is None


def test_too_many_observations_are_refused_not_truncated():
    with pytest.raises(ValueError, match="more than"):
        _set(*[(Kind.ENV, f"V{i}", "1") for i in range(obs.MAX_OBSERVATIONS + 1)])


@pytest.mark.parametrize("value, keyable", [
    (2.5, True), ((1, "a"), True), (len, True), (json, True), (object(), False), ({1: 2}, None),
])
def test_value_digest_is_content_or_names_what_it_cannot_key(value, keyable):
    found = obs.value_digest(value, NUMBA_CUDA)
    if keyable is None:  # dicts: keyed once keying/values.py learns them
        return
    assert found.startswith(obs.UNKEYABLE) != keyable
    if not keyable:
        assert "builtins.object" in found



def test_headers_are_what_nvrtc_opened(tmp_path):
    """A link file's headers are read from NVRTC's time trace: found through its include
    path in either form and transitively, never parsed again with other rules."""
    from numba.cuda.cudadrv import nvrtc

    from kbuild.backend.observe import Observer
    from kbuild.backend.observe.hooks import _nvrtc_headers

    (tmp_path / "inc" / "sub").mkdir(parents=True)
    (tmp_path / "inc" / "a.h").write_text('#include "sub/b.cuh"\n#define A 1\n')
    (tmp_path / "inc" / "sub" / "b.cuh").write_text("#define B 2\n")
    (tmp_path / "inc" / "unused.h").write_text("#define U 3\n")
    src = ('#include <a.h>\n#if 0\n#include "unused.h"\n#endif\n'
           'extern "C" __device__ int f(int* r, int x) { *r = x * A * B; return 0; }\n')
    observer = Observer(root=tmp_path)
    saved = nvrtc.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS
    nvrtc.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS = str(tmp_path / "inc")
    try:
        with _nvrtc_headers(observer):
            nvrtc.compile(src, "f.cu", (8, 0), ltoir=True)
    finally:
        nvrtc.config.CUDA_NVRTC_EXTRA_SEARCH_PATHS = saved
    assert sorted(n for k, n in observer.names if k is obs.Kind.HEADER) == ["inc/a.h", "inc/sub/b.cuh"]


def test_nested_answers_each_keep_what_they_read():
    """An answer made while another is being made (a call typed inside a device function's
    compile) collects into its own record: the two start alike (empty), and the inner one's
    end must not take the outer's record away (it did: the outer's later reads were kept
    by nobody, and its end raised `list.remove(x): x not in list`, hiding numba's error)."""
    from kbuild.backend.observe import Observer
    from kbuild.backend.observe import observer as observe

    observer = Observer()
    outer_q, inner_q = ("test-outer", object()), ("test-inner", object())
    try:
        with observer.answering(outer_q, lambda: False):
            with observer.answering(inner_q, lambda: False):
                observer.read("m", "INNER")
            observer.read("m", "OUTER")
        assert set(observe._ANSWERS[inner_q]) == {(Kind.READ, "m:INNER")}
        assert set(observe._ANSWERS[outer_q]) == {(Kind.READ, "m:INNER"), (Kind.READ, "m:OUTER")}
        # An error inside the inner one reaches the caller as it is.
        with pytest.raises(ZeroDivisionError):
            with observer.answering(outer_q, lambda: False):
                with observer.answering(inner_q, lambda: False):
                    1 / 0
    finally:
        observe._ANSWERS.pop(outer_q, None)
        observe._ANSWERS.pop(inner_q, None)


_F = obs.FILLED_DIGEST
_READER = (Kind.OVERLOAD, "m:ol_seen", "r1")  # the reader's own code
_FILLER = (Kind.FILE, "table.json", "t1")  # what the compile that filled it read


@pytest.mark.parametrize("why, recorded, filled, own, others, in_order", [
    ("read filled, filled ahead", [_READER, _FILLER, (Kind.FILLED, "m:_SEEN", _F)],
     {"m:_SEEN"}, (), [], True),
    ("read filled, nothing ahead fills it", [_READER, _FILLER, (Kind.FILLED, "m:_SEEN", _F)],
     set(), (), [], False),
    ("its own fill", [_READER, (Kind.FILLED, "m:_SEEN", _F)], set(), ("m:_SEEN",), [], True),
    ("read empty, never seen reading it", [_READER], {"m:_SEEN"}, (), [], True),
    ("read empty, another build of it read it filled",
     [_READER], {"m:_SEEN"}, (), [[_READER, _FILLER, (Kind.FILLED, "m:_SEEN", _F)]], False),
    ("read empty, the build that read it filled ran other code",
     [_READER], {"m:_SEEN"}, (),
     [[(Kind.OVERLOAD, "m:ol_seen", "r0"), _FILLER, (Kind.FILLED, "m:_SEEN", _F)]], True),
    ("read empty, what another build read filled is not filled ahead",
     [_READER], {"m:_OTHER"}, (), [[_READER, (Kind.FILLED, "m:_SEEN", _F)]], True),
])
def test_read_in_order_tells_a_set_read_as_the_builds_order_fills(
        why, recorded, filled, own, others, in_order):
    """A set read filled what compiles ahead of it fill: a holder read empty leaves no
    trace, so another set of the same record (the same code, compiled where the holder
    was filled) says what it reads."""
    mine = _set(*recorded)
    record = obs.Record(K, (mine, *(_set(*rows) for rows in others)))
    assert obs.read_in_order(mine.observations, filled, own, record) is in_order, why
