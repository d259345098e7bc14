"""CUDA C source by what its compile sees: comments by their shape, never their words.

NVRTC replaces each comment with a space before it reads a token, so a comment's words
never reach the binary. Its place does: a kernel built with `lineinfo` or `debug` (and
`__LINE__`, which `assert` expands to) names the line and column of every token after
it. `source_form` keeps every byte outside comments as it is, a block comment as the
lines it spans and the shape of its last, a line comment as nothing but the lines it
spans (nothing follows it on its line), and no blank lines at the end, so an edit of a
comment's words, a line comment added or removed, or blank lines at the end keys the
same, and any edit that moves a token keys anew (ccache's preprocessor mode goes
further: it keys the preprocessed text, which this cannot make without the compiler's
include path and macros).

The lexer follows C++'s translation phases as far as comments need (a backslash at a
line's end splices it to the next, strings and character literals hold `//` and `/*`,
`'` separates a number's digits) and gives up, answering None, where reading on could
take code for a comment: a raw string, a trigraph, a backslash followed by blanks before
a newline (a splice to some compilers), a lone carriage return, a `'` it cannot place,
an unterminated string, character literal or comment. The caller then keys the bytes.
"""

from __future__ import annotations

import re

from .encode import digest, digest_of

_BACKSLASH, _SLASH, _STAR, _QUOTE, _APOSTROPHE, _HASH, _NEWLINE, _DOT = b"\\/*\"'#\n."
_IDENT = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_CHAR_PREFIXES = (b"u8", b"u", b"U", b"L")
_INCLUDES = (b"include", b"include_next", b"import")
_RAW = re.compile(rb'R(\\\r?\n)*"')  # a raw string's start, spliced or not
_SPECIAL = re.compile(rb"[\\/\"'#%]")
# A block comment's last line, by what may count in a column: its tabs and bytes past
# ASCII as they are, every other byte a space.
_SHAPE = bytes(b if b == ord("\t") or b >= 0x80 else ord(" ") for b in range(256))


class _GiveUp(Exception):
    pass


def compiled_as_cuda_c(path: str) -> bool:
    """Whether numba compiles a link file at `path` with NVRTC (by its suffix, `.cu`)."""
    return path.endswith(".cu")


def source_digest(data: bytes) -> str:
    """The digest of a CUDA C file by `source_form`; of its bytes where that gives up."""
    form = source_form(data)
    return digest(data) if form is None else digest_of(("cuda-c", form))


def source_form(data: bytes) -> bytes | None:
    """`data` with each comment replaced by its shape (module docstring), or None where
    the lexer cannot be sure what is a comment."""
    if b"??/" in data or _RAW.search(data) or data.count(b"\r") != data.count(b"\r\n"):
        return None  # a trigraph backslash, a raw string, a lone carriage return: bytes
    try:
        form = bytes(_Lexer(data).run())
    except _GiveUp:
        return None
    # Blank lines at the end move no token; a backslash before them splices one of them.
    end = form.rstrip(b" \t\r\n\f\v")
    return form if end.endswith(b"\\") else end


class _Lexer:
    def __init__(self, data: bytes):
        self.data, self.out, self.i = data, bytearray(), 0

    def run(self) -> bytearray:
        data, n = self.data, len(self.data)
        while True:
            found = _SPECIAL.search(data, self.i)
            if found is None:
                self._copy(n - self.i)
                return self.out
            self._copy(found.start() - self.i)
            c = data[self.i]
            if c == _BACKSLASH:
                self._copy(self._splice_at(self.i) or 1)
            elif c == _SLASH and self._next_is(self.i + 1, _SLASH):
                self._line_comment()
            elif c == _SLASH and self._next_is(self.i + 1, _STAR):
                self._block_comment()
            elif c == _QUOTE:
                self._quoted(_QUOTE)
            elif c == _APOSTROPHE and not self._digit_separator():
                self._quoted(_APOSTROPHE)
            elif (c == _HASH or data[self.i:self.i + 2] == b"%:") and self._is_include():
                self._rest_of_line()  # #include <a//b.h>: a header's name, not a comment
            else:
                self._copy(1)

    def _copy(self, count: int) -> None:
        self.out += self.data[self.i:self.i + count]
        self.i += count

    def _splice_at(self, j: int) -> int:
        """The length of a line splice at j (backslash, newline), 0 if none there."""
        data = self.data
        if data[j:j + 2] == b"\\\n":
            return 2
        if data[j:j + 3] == b"\\\r\n":
            return 3
        if data[j:j + 1] == b"\\":
            k = j + 1
            while k < len(data) and data[k] in b" \t":
                k += 1
            if k > j + 1 and data[k:k + 1] in (b"\n", b"\r"):
                raise _GiveUp  # backslash, blanks, newline: a splice to some compilers
        return 0

    def _skip_splices(self, j: int) -> int:
        while True:
            length = self._splice_at(j)
            if not length:
                return j
            j += length

    def _next_is(self, j: int, byte: int) -> bool:
        """Whether the next character from j, past line splices, is `byte`."""
        j = self._skip_splices(j)
        return j < len(self.data) and self.data[j] == byte

    def _line_comment(self) -> None:
        """`//` to the newline no splice continues: nothing but its splices (the lines
        it spans). A newline follows it: it and the blanks before it end the line as
        the newline alone would (a backslash before them is no splice)."""
        data, n = self.data, len(self.data)
        while self.out and self.out[-1] in b" \t":
            self.out.pop()
        if self.out.endswith(b"\\"):
            self.out += b" "
        second = self._skip_splices(self.i + 1)
        self.out += b"\\\n" * data.count(b"\n", self.i, second)
        self.i = second + 1
        while self.i < n:
            length = self._splice_at(self.i)
            if length:
                self.out += b"\\\n"
                self.i += length
            elif data[self.i] in b"\r\n":
                return
            else:
                self.i += 1

    def _block_comment(self) -> None:
        """`/*` to `*/` (either may be split by splices): the lines it spans and its last
        line's shape (its length, its tabs and its bytes past ASCII kept: a column may
        count tab stops or characters)."""
        data, n, start = self.data, len(self.data), self.i
        self.i = self._skip_splices(self.i + 1) + 1
        while True:
            if self.i >= n:
                raise _GiveUp  # unterminated
            if data[self.i] == _STAR and self._next_is(self.i + 1, _SLASH):
                end = self._skip_splices(self.i + 1) + 1
                break
            self.i += 1
        self.i = end
        lines = data.count(b"\n", start, end)
        last = data[data.rfind(b"\n", start, end) + 1 if lines else start:end]
        self.out += b"/*%d:%s*/" % (lines, last.translate(_SHAPE))

    def _quoted(self, quote: int) -> None:
        """A string or character literal, copied whole (escapes, splices and all)."""
        data, n = self.data, len(self.data)
        self._copy(1)
        while True:
            if self.i >= n:
                raise _GiveUp
            c = data[self.i]
            if c == _BACKSLASH:
                self._copy(self._splice_at(self.i) or 2)  # a splice, or an escape
            elif c == quote:
                self._copy(1)
                return
            elif c in b"\r\n":
                raise _GiveUp  # unterminated on its line
            else:
                self._copy(1)

    def _digit_separator(self) -> bool:
        """Whether the `'` here is a number's digit separator (`1'000`), not a character
        literal (`'a'`, `u8'a'`); gives up on a `'` after any other word."""
        out = self.out
        j = len(out)
        while j > 0 and (out[j - 1] in _IDENT or out[j - 1] == _DOT):
            j -= 1
        before = out[:j].removesuffix(b"\n").removesuffix(b"\r")
        if before.endswith(b"\\") and len(before) > 1 and \
                (before[-2] in _IDENT or before[-2] == _DOT):
            raise _GiveUp  # a word that a splice runs through: not placed here
        word = bytes(out[j:])
        if not word or word in _CHAR_PREFIXES:
            return False
        if word[:1].isdigit() or (word[:1] == b"." and word[1:2].isdigit()):
            return True
        raise _GiveUp

    def _is_include(self) -> bool:
        """Whether the `#` (`%:`) here starts an `#include` line."""
        data = self.data
        j = self.i + (1 if data[self.i] == _HASH else 2)
        while j < len(data) and data[j] in b" \t":
            j += 1
        if data[j:j + 2] == b"/*" or data[j:j + 1] == b"\\":
            raise _GiveUp  # a comment or a splice before the directive's name
        k = j
        while k < len(data) and data[k] in _IDENT:
            k += 1
        return data[j:k] in _INCLUDES

    def _rest_of_line(self) -> None:
        """Copy to the newline no splice continues, comments and all."""
        data, n = self.data, len(self.data)
        while self.i < n and data[self.i] != _NEWLINE:
            self._copy(self._splice_at(self.i) or 1)
