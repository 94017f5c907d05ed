"""The learned admission model: features and Belady-boundary labels of CPU-tier offers
(``offers``), the model (``model``), training and threshold sweep (``pipeline``), and
replays comparing CPU-tier policies on the same GPU victims (``replay``, ``compare``)."""
