# Gradient-boosted trees walked over a block of feature rows (the learned policies' scores).
# Every row walks every tree while the row is in cache (a per-tree pass over all rows, as
# scikit-learn's predictor does, reads the whole block once per tree). The comparisons and the
# order of the sum are scikit-learn's, so the raw values are the same doubles.


cdef class Forest:
    """Trees as flat node arrays: per node ``feature`` (-1: a leaf), ``threshold`` (``x <=
    threshold`` goes ``left``), ``nan_left`` (where a NaN goes), ``left``/``right`` (global
    node indices) and ``value`` (a leaf's); ``roots`` the first node of each tree, in the
    order their values are summed after ``baseline``. ``features``: the width of a row."""

    cdef int32_t[::1] feature
    cdef double[::1] threshold
    cdef int8_t[::1] nan_left
    cdef int32_t[::1] left
    cdef int32_t[::1] right
    cdef double[::1] value
    cdef int32_t[::1] roots
    cdef readonly double baseline
    cdef readonly int features

    def __init__(self, feature, threshold, nan_left, left, right, value, roots,
                 double baseline, int features):
        arrays = [np.ascontiguousarray(a, dtype=d) for a, d in (
            (feature, np.int32), (threshold, np.float64), (nan_left, np.int8), (left, np.int32),
            (right, np.int32), (value, np.float64))]
        n = len(arrays[0])
        if any(len(a) != n for a in arrays):
            raise ValueError(f"node arrays differ in length: {[len(a) for a in arrays]}")
        f, lo, hi = arrays[0], arrays[3], arrays[4]
        inner = f >= 0
        at = np.arange(n)
        # children come after their node (scikit-learn's order), so every walk ends
        if (f >= features).any() or ((lo <= at) | (lo >= n) | (hi <= at) | (hi >= n))[inner].any():
            raise ValueError("a node points outside the forest, its features or back up its tree")
        roots = np.ascontiguousarray(roots, dtype=np.int32)
        if ((roots < 0) | (roots >= n)).any():
            raise ValueError("a tree starts outside the forest")
        (self.feature, self.threshold, self.nan_left, self.left, self.right,
         self.value) = arrays
        self.roots = roots
        self.baseline = baseline
        self.features = features

    @property
    def trees(self) -> int:
        return self.roots.shape[0]

    def raw(self, X):
        """Baseline plus every tree's leaf value, per row of ``X`` (rows x ``features``)."""
        cdef const double[:, ::1] x = np.ascontiguousarray(X, dtype=np.float64)
        if x.shape[1] != self.features:
            raise ValueError(f"rows have {x.shape[1]} features, the forest reads "
                             f"{self.features}")
        cdef Py_ssize_t n = self.feature.shape[0]
        # children side by side (left, right), so the comparison picks one without a branch
        children = np.empty(2 * n, dtype=np.int32)
        nan_child = np.where(np.asarray(self.nan_left) != 0, self.left, self.right).astype(
            np.int32)
        children[0::2] = self.left
        children[1::2] = self.right
        cdef const int32_t[::1] child = children
        cdef const int32_t[::1] on_nan = nan_child
        out = np.empty(x.shape[0], dtype=np.float64)
        cdef double[::1] o = out
        cdef const int32_t* feature = &self.feature[0]
        cdef const double* threshold = &self.threshold[0]
        cdef const double* value = &self.value[0]
        cdef const int32_t* roots = &self.roots[0]
        cdef Py_ssize_t r, t, trees = self.roots.shape[0]
        cdef int32_t i, f
        cdef double total, v
        with nogil:
            for r in range(x.shape[0]):
                total = 0.0
                total += self.baseline
                for t in range(trees):
                    i = roots[t]
                    f = feature[i]
                    while f >= 0:
                        v = x[r, f]
                        if v != v:
                            i = on_nan[i]
                        else:  # x <= threshold goes left (index 0), as scikit-learn's
                            i = child[2 * i + (v > threshold[i])]
                        f = feature[i]
                    total += value[i]
                o[r] = total
        return out
