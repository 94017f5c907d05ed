"""The implementations behind ``kvtier simulate`` and ``kvtier analyze`` (the verb modules
in ``kvtier/verbs`` stay standard-library-only and import these inside ``run``)."""
