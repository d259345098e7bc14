"""CUDA C keyed by what NVRTC compiles: a comment's words are no input, its place is.

`keying.ctext.source_form` is checked three ways: a table of edits that must key the
same (each pair compiled by the real NVRTC, with `debug` and with `lineinfo`, to the same
bytes) or anew, and of text the lexer must not guess at; and through `kbuild build` on
tests/staleproj, whose link files and headers (found on NVRTC's include path) an edit of a
comment's words leaves built, the journal then answering the next run.
"""

from __future__ import annotations

import pytest

from kbuild.keying.ctext import source_digest, source_form

BASE = '''// gain.cu: scales by a gain
#define CHECK(c) ((c) ? 0 : __LINE__)
extern "C" __device__ int f(int* r, int x) { /* scale */ int y = x * 3;
  const char* s = "a // b /* c */";
  *r = y + CHECK(x > 0) + (s[1] == '/') + 1'000; // the sum
  /* the first line's words
     and the last */ return 0;
}
'''


def _edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


# Edits NVRTC cannot see: the same form, the same binary.
SAME = [
    ("line-comment-words", _edit("// the sum", "// what it adds up to, it's 3")),
    ("line-comment-removed", _edit(" // the sum", "")),
    ("line-comment-added", _edit("int y = x * 3;", "int y = x * 3;  // thrice")),
    ("first-line-comment-words", _edit("// gain.cu: scales by a gain", "// another /* word */")),
    ("block-comment-words-same-length", _edit("/* scale */", "/* twice */")),
    ("blank-lines-at-the-end", BASE + "\n  \n// last words\n"),
    ("block-comment-first-line-words", _edit("the first line's words", "other words, any length")),
]
# Edits that move a token or change one: keyed anew.
DIFFERENT = [
    ("block-comment-length-before-code", _edit("/* scale */", "/* scaled */")),
    ("block-comment-gains-a-line", _edit("/* scale */", "/*\nscale */")),
    ("line-comment-becomes-a-line", _edit("// the sum", "\n")),
    ("string-holding-comment-marks", _edit('"a // b /* c */"', '"a // B /* c */"')),
    ("character-literal-slash", _edit("'/'", "'*'")),
    ("number-with-digit-separator", _edit("1'000", "1'001")),
    ("code-after-a-spliced-line-comment", _edit("// the sum", "// the sum \\\n  + 1;")),
    ("include-header-name-with-comment-marks", "#include <a//b.h>\n" + BASE),
    ("blank-line-that-a-final-backslash-splices", BASE.rstrip("\n") + " \\\n\n"),
]
GIVE_UP = [
    ("raw-string", 'auto s = R"(/* not a comment */)";\n'),
    ("raw-string-spliced", 'auto s = R\\\n"(/* x */)";\n'),
    ("trigraph-backslash", "int a; // x ??/\nint b;\n"),
    ("backslash-blank-newline", "int a; /* x *\\ \n/ int b;\n"),
    ("lone-carriage-return", "int a; /* x */\rint b;\n"),
    ("unterminated-block-comment", "int a; /* x\n"),
    ("unterminated-string", 'const char* s = "ab\nint b;\n'),
    ("quote-after-a-word", "int a = x'y';\n"),
    ("quote-after-a-word-a-splice-runs-through", "int a = x\\\n0'//';\n"),
    ("comment-between-hash-and-include", "# /* c */ include <a//b.h>\n"),
]


@pytest.mark.parametrize("name,edited", SAME, ids=[c[0] for c in SAME])
def test_an_edit_nvrtc_cannot_see_keys_the_same(name, edited):
    assert edited != BASE
    assert source_form(edited.encode()) == source_form(BASE.encode()) is not None
    assert source_digest(edited.encode()) == source_digest(BASE.encode())


@pytest.mark.parametrize("name,edited", DIFFERENT, ids=[c[0] for c in DIFFERENT])
def test_an_edit_that_moves_or_changes_a_token_keys_anew(name, edited):
    assert source_form(edited.encode()) is not None
    assert source_digest(edited.encode()) != source_digest(BASE.encode())


@pytest.mark.parametrize("name,text", GIVE_UP, ids=[c[0] for c in GIVE_UP])
def test_text_the_lexer_cannot_place_is_keyed_by_its_bytes(name, text):
    data = text.encode()
    assert source_form(data) is None
    assert source_digest(data) != source_digest(data + b"// more\n")


def _ltoir(source: str, **options) -> bytes:
    from numba.cuda.cudadrv import nvrtc

    return bytes(nvrtc.compile(source, "gain.cu", (8, 0), ltoir=True, **options)[0].code)


@pytest.mark.parametrize("options", [{"debug": True}, {"lineinfo": True}],
                         ids=["debug", "lineinfo"])
def test_what_keys_the_same_nvrtc_compiles_to_the_same_bytes(options):
    """The real compiler, with what names lines and columns on (numba-cuda-mlir passes a
    kernel's `debug` and `lineinfo` to a `.cu` file's compile)."""
    base = _ltoir(BASE, **options)
    for name, edited in SAME:
        assert _ltoir(edited, **options) == base, name
    if options.get("debug"):  # the form's premise: debug information names columns
        moved = dict(DIFFERENT)["block-comment-length-before-code"]
        assert _ltoir(moved, **options) != base
