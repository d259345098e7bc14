"""Key labels are typed (`keying.tree.LabelKind`), and their text never changes.

A label's text is hashed into every digest above it and recorded in manifests that
explain, history and the graph read back, so each kind must make exactly the text
the f-strings before it made (key schema 4).
"""

import pytest

from kbuild.keying.tree import (LabelKind, function_name, label_kind, label_name, reached_as,
                                record_label)

NAME = "pkg.mod:outer.<locals>.f"

# (the label built by the API, the text the f-string made before labels were typed)
CASES = [
    (LabelKind.TARGET.label(), "target"),
    (LabelKind.KERNEL.label(NAME), f"kernel {NAME}"),
    (LabelKind.CALLEE.label(NAME), f"callee {NAME}"),
    (LabelKind.OVERLOAD.label(NAME), f"overload {NAME}"),
    (LabelKind.OBSERVED.label(NAME), f"observed {NAME}"),
    (LabelKind.BODY.label(), "body"),
    (LabelKind.OPTION.label("fastmath"), "option fastmath"),
    (LabelKind.GLOBAL.label("mathx.sq"), "global mathx.sq"),
    (LabelKind.CLOSURE.label("scale"), "closure scale"),
    (LabelKind.DEFAULT.label("n"), "default n"),
    (LabelKind.BUILTIN.label("GAIN"), "builtin GAIN"),
    (LabelKind.ATTRIBUTE.label("scale"), "attribute scale"),
    (LabelKind.FILE.label(), "file"),
    (LabelKind.SIGNATURE.label(), "signature"),
    (LabelKind.ARGUMENT.label(2), "argument 2"),
    (LabelKind.FIELD.label("x"), "field 'x'"),
    (LabelKind.LAYOUT.label(), "layout"),
    (LabelKind.ARCH.label(), "arch"),
    (LabelKind.TOOLCHAIN.label(), "toolchain"),
    (LabelKind.CONFIG.label(), "config"),
    (LabelKind.LAUNCH.label(), "launch"),
    (record_label(LabelKind.ARGUMENT.label(1)), "argument 1 record"),
    (reached_as(LabelKind.CALLEE.label(NAME), "double"), f"callee {NAME} (as double)"),
]


def test_every_kind_has_a_case():
    assert {label_kind(text) for _, text in CASES} == set(LabelKind)


@pytest.mark.parametrize("built, text", CASES, ids=[t for _, t in CASES])
def test_a_label_has_the_text_the_f_string_made(built, text):
    assert built == text
    assert type(built) is str  # hashed as text, never as an enum member


@pytest.mark.parametrize("built, text", CASES, ids=[t for _, t in CASES])
def test_a_label_reads_back_as_its_kind(built, text):
    assert label_kind(built) is LabelKind(text.partition(" ")[0])


def test_names_read_back_as_the_prefix_parsing_did():
    assert label_name(LabelKind.GLOBAL.label("consts.SCALE")) == "consts.SCALE"
    assert label_name(record_label(LabelKind.GLOBAL.label("R"))) == "R record"
    assert function_name(LabelKind.CALLEE.label(NAME)) == NAME
    assert function_name(reached_as(LabelKind.CALLEE.label(NAME), "g")) == NAME


def test_toolchain_and_config_entries_have_no_kind():
    assert label_kind("numba-cuda") is None
    assert label_kind("kbuild key schema") is None
    assert label_kind("OPT") is None
