from tasks.core.sentences import normalise_text


def test_control_characters_become_spaces():
    assert normalise_text("a\x00b\x07 c\x1b[31m\x7f d\x85e") == "a b c [31m d e"
    assert normalise_text("caf\u0065\u0301 \u200d kept") == "caf\u00e9 \u200d kept"  # NFC; a joiner is not a control
