from kvtier.verbs import not_yet

SUMMARY = "placeholder"
EXAMPLE = "kvtier store"


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise not_yet("store", 2, "in progress")
