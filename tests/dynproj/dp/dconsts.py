"""Constants read dynamically at typing and lowering time."""

SCALE = 2.0
OFFSET = 1.0
TWIST = 0.5
FIELDS = ("a", "b")
