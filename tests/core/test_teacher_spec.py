from tasks.core.teacher_spec import Member, split


def test_a_plain_spec_is_one_member_taken_as_it_is_even_with_a_star() -> None:
    assert split("all-mpnet-base-v2") == [Member("all-mpnet-base-v2", None)]
    assert split("models/0.5*odd") == [Member("models/0.5*odd", None)]


def test_a_composite_splits_into_stripped_members_with_their_weights_as_written() -> None:
    assert split(" a + 0.50 * org/b +c ") == [Member("a", None), Member("org/b", "0.50"), Member("c", None)]


def test_a_star_without_a_weight_gives_an_empty_weight_not_none() -> None:
    assert split("a+*b") == [Member("a", None), Member("b", "")]
