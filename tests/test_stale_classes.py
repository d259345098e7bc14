"""Issue 26's stale classes, closed by construction: an edit in a channel numba reads while
it compiles - a header NVRTC opens, an option a function was registered with, a typing or
lowering registration or a data model in any module - rebuilds exactly what read it.

tests/staleproj holds one of each. Every case edits a copy of the project, builds it
incrementally against a copy of the baseline store and freshly into an empty one, and
asserts what tests/test_observed_matrix.py asserts: no target is `cached` with bytes the
fresh build does not make, and the targets rebuilt are the ones the case names.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest

from editmatrix_support import (
    artifacts, assert_matches_fresh, build, case, copy_tree, edits, fresh_checkout,
    matrix_baseline, reference, replace, run_case, with_status,
)

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "staleproj"
SPAN = {"k_span_make", "k_span_width", "k_span_cast", "k_span_sum", "k_span_mid",
        "k_span_top"}
TARGETS = frozenset({"k_declared", "k_linked", "k_jitable", "k_overload_options",
                     "k_prefer_literal", "k_intrinsic_literal"} | SPAN)

_JIT, _LOWER, _MODELS = "sp/jit.py", "sp/ext/lowering.py", "sp/ext/models.py"

def _appended(path: str, text: str):
    def edit(root: Path) -> None:
        target = root / path
        target.write_text(target.read_text() + "\n" + text)
    return edit


CASES = [
    # Headers NVRTC finds through its include path (NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS):
    # the angle form, a quoted one in a subfolder of the path, one included by a header,
    # and a quoted one that is not beside the file including it.
    case("header-angle-form-transitive", replace("sp/include/sp_deep.h", "1.0f", "5.0f"),
         {"k_declared"}),
    case("header-quoted-in-search-path-subfolder",
         replace("sp/include/sub/sp_bias.h", "0.5f", "0.75f"), {"k_declared"}),
    case("header-of-a-link-option-file", replace("sp/include/sp_twice.h", "2.0f", "7.0f"),
         {"k_linked"}),
    case("header-unused", lambda root: (root / "sp/include/sp_unused.h").write_text("#x\n"),
         set()),
    # A comment's words are no input of NVRTC's compile (`keying.ctext`): in a link file,
    # in a header it opened.
    case("link-file-comment-words",
         replace("sp/native/gain.cu", "// Found through NVRTC's include path",
                 "// Looked up on NVRTC's search path, it's"), set()),
    case("header-comment-added-after-code",
         replace("sp/include/sp_deep.h", "#define SP_DEEP 1.0f", "#define SP_DEEP 1.0f  // deep"),
         set()),
    # Every option a function was registered with.
    case("register-jitable-fastmath",
         replace(_JIT, "@register_jitable\n", "@register_jitable(fastmath=True)\n"),
         {"k_jitable"}),
    case("overload-jit-options",
         replace(_JIT, '"fastmath": False', '"fastmath": True'), {"k_overload_options"}),
    case("overload-prefer-literal",
         replace(_JIT, 'pick, target="cuda", prefer_literal=False)',
                 'pick, target="cuda", prefer_literal=True)'),
         {"k_prefer_literal"}),
    case("intrinsic-prefer-literal",
         replace(_JIT, "prefer_literal=False)\ndef lit", "prefer_literal=True)\ndef lit"),
         {"k_intrinsic_literal"}),
    # Lowering and data models in other modules than the type they are for.
    case("lower-builtin-in-another-module",
         replace(_LOWER, "span.lo = context.cast(builder, lo,", "span.lo = context.cast(builder, hi,"),
         SPAN),
    case("lower-getattr-in-another-module",
         replace(_LOWER, "return builder.fsub(hi, lo)", "return builder.fadd(hi, lo)"),
         {"k_span_width"}),
    case("lower-cast-in-another-module",
         replace(_LOWER, "return builder.fadd(lo, hi)\n\n\n@lower_builtin(span_sum",
                 "return builder.fmul(lo, hi)\n\n\n@lower_builtin(span_sum"),
         {"k_span_cast"}),
    case("data-model-in-another-module",
         replace(_MODELS, '[("lo", types.float32), ("hi", types.float32)]',
                 '[("hi", types.float32), ("lo", types.float32)]'),
         SPAN),
    case("attribute-wrapper-arguments",
         edits(replace(_MODELS, 'make_attribute_wrapper(SpanType, "lo", "lo")',
                       'make_attribute_wrapper(SpanType, "hi", "lo")'),
               replace(_MODELS, 'make_attribute_wrapper(SpanType, "hi", "hi")',
                       'make_attribute_wrapper(SpanType, "lo", "hi")')),
         {"k_span_make", "k_span_width", "k_span_mid", "k_span_top"}),
    # Typing in a module of its own, away from the stub it types and the lowering.
    case("typing-template-in-another-module",
         replace("sp/ext/typer.py", "signature(types.float32, span)",
                 "signature(types.float64, span)"),
         {"k_span_sum"}),
    case("lowering-reading-an-llvmlite-type",
         replace("sp/ext/raw.py", "F32 = ir.FloatType()", "F32 = ir.DoubleType()"),
         {"k_span_top"}),
    # That value set from another module's code (its own module's source unchanged): by
    # what it is, an llvmlite type by its LLVM text; set again to an equal one, by nothing.
    case("lowering-value-with-no-content-form-set-from-another-module",
         _appended("sp/kernels.py", "import sp.ext.raw as _r\n_r.F32 = _r.ir.DoubleType()\n"),
         {"k_span_top"}),
    case("lowering-value-set-again-to-an-equal-one",
         _appended("sp/kernels.py", "import sp.ext.raw as _r\n_r.F32 = _r.ir.FloatType()\n"),
         set()),
    # The extension's Python class is keyed by what it holds, its typing and lowering by
    # what each compile looked up: a host helper beside it is no input.
    case("host-helper-beside-the-extension-class",
         replace("sp/ext/types.py", "span_type = SpanType()\n",
                 'span_type = SpanType()\n\n\ndef describe(span):  # for logs\n'
                 '    return f"[{span.lo}, {span.hi}]"\n'),
         set()),
    case("lowering-module-unrelated-edit",
         replace(_LOWER, '"""Lowering of the type', 'UNUSED = 1\n"""Lowering of the type'),
         set()),
]


_checkout = functools.partial(fresh_checkout, PROJECT)  # where -> the copy at where/proj


def _env(project: Path) -> dict:
    return {"NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS": str(project / "sp" / "include")}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    return matrix_baseline(tmp_path_factory, "staleproj", _checkout, env=_env)


def test_baseline_builds_every_target_and_then_nothing(baseline, tmp_path):
    where, result = baseline
    assert with_status(result, "built") == TARGETS, [r["error"] for r in result["targets"]]
    # What a compile registers itself (an @overload_method's lowering, an @intrinsic's code
    # generator) is never part of what is observed: a process that compiled nothing finds
    # the same, and two worker processes the same as one.
    project = _checkout(tmp_path)
    for jobs in ("1", "2"):
        again = build(project, copy_tree(where / "store", tmp_path / f"store{jobs}"),
                      "-j", jobs, env_extra=_env(project))
        assert with_status(again, "cached") == TARGETS


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Where this worker's cases check the project out, one after another: at one path,
    the reference builds' environment (NVRTC's search path in the checkout) is one, and
    one warm zygote serves them all (`editmatrix_support.reference`)."""
    return tmp_path_factory.mktemp("stale-work")


@pytest.mark.parametrize("the_case", CASES, ids=lambda c: c.id)
def test_incremental_matches_fresh(baseline, work, tmp_path, the_case):
    where, first = baseline
    shutil.rmtree(work / "proj", ignore_errors=True)
    project = _checkout(work)
    incremental, fresh = run_case(project, where / "store", tmp_path, the_case, _env(project))
    _, clean = assert_matches_fresh(incremental, fresh, the_case.rebuilt)
    changed = {t for t, arts in artifacts(first).items() if arts != clean[t]}
    assert changed <= the_case.rebuilt, "a target's code changed that the case did not expect"
    if the_case.rebuilt:
        assert changed, "the case changes no compiled code: it proves nothing"


def test_a_link_file_whose_comment_changed_is_journaled_by_the_bytes_it_holds(baseline, tmp_path):
    """A link file is keyed by its CUDA C form, the journal by its bytes: after an edit of
    a comment's words the journal sees the file changed, the build keys it again and
    finds every target built, and the journal it writes (checked against that form)
    answers the next run."""
    where, _ = baseline
    project = _checkout(tmp_path)
    store, env = copy_tree(where / "store", tmp_path / "store"), _env(project)
    build(project, store, env_extra=env)
    assert build(project, store, env_extra=env)["mode"]["used"] == "direct"
    replace("sp/native/gain.cu", "// Found through", "// Looked up through")(project)
    after = build(project, store, env_extra=env)
    assert after["mode"]["used"] == "full" and with_status(after, "cached") == TARGETS
    assert build(project, store, env_extra=env)["mode"]["used"] == "direct"


def test_a_failure_is_kept_only_while_what_typing_asked_of_a_type_is_unchanged(tmp_path):
    """A compile that fails at typing read less than one that succeeds: whether Span
    converts to float32 is asked of the project's SpanType (`can_convert_to`), and that
    answer decides the failure. A failure recorded while it said no is not the answer
    once it says yes again: the target compiles, to a fresh build's bytes."""
    project = _checkout(tmp_path)
    types_py = project / "sp" / "ext" / "types.py"
    text = types_py.read_text()
    assert text.count("if other == types.float32:") == 1
    types_py.write_text(text.replace("if other == types.float32:", "if other != types.float32:"))
    refused = build(project, tmp_path / "store", "-k", "k_span_cast", env_extra=_env(project),
                    expect_rc=1)
    assert with_status(refused, "failed") == {"k_span_cast"}
    types_py.write_text(text)
    again = build(project, tmp_path / "store", "k_span_cast", env_extra=_env(project))
    fresh = reference(project, tmp_path / "fresh", "k_span_cast", env_extra=_env(project))
    assert with_status(again, "built") == {"k_span_cast"}, [r["error"] for r in again["targets"]]
    assert artifacts(again) == artifacts(fresh)


def test_a_failure_in_nvrtc_is_not_kept_since_the_headers_it_read_are_unknown(tmp_path):
    """NVRTC lists the headers it opened only when it compiles: a failure keeps no
    record of the header with the error. Kept, it was served again after that header was
    fixed (and another one edited, so that no stored build matched either): `failed
    earlier with this key`. Now such a failure is compiled again each build, and the
    fixed target builds to a fresh build's bytes."""
    project = _checkout(tmp_path)
    env = _env(project)
    build(project, tmp_path / "store", "k_declared", env_extra=env)
    bias = project / "sp" / "include" / "sub" / "sp_bias.h"
    good = bias.read_text()
    bias.write_text(good.replace("0.5f", "0.5f +"))
    for _ in range(2):  # compiled again, not answered from a record
        refused = build(project, tmp_path / "store", "-k", "k_declared", env_extra=env,
                        expect_rc=1)
        error = next(r["error"] for r in refused["targets"] if r["status"] == "failed")
        assert "NVRTC_ERROR_COMPILATION" in error and "failed earlier" not in error
    bias.write_text(good)
    replace("sp/include/sp_deep.h", "1.0f", "3.0f")(project)
    again = build(project, tmp_path / "store", "k_declared", env_extra=env)
    fresh = reference(project, tmp_path / "fresh", "k_declared", env_extra=env)
    assert with_status(again, "built") == {"k_declared"}, [r["error"] for r in again["targets"]]
    assert artifacts(again) == artifacts(fresh)
