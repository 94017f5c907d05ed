from kvtier.verbs import not_yet

SUMMARY = "placeholder"
EXAMPLE = "kvtier demo"


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise not_yet("demo", 2, "in progress")
