"""A single-process Lloyd's algorithm: the reference the sharded K-means runs are compared with."""

from __future__ import annotations


def lloyd_step(rows: list[list[float]], centroids: list[list[float]]) -> tuple[list[list[float]], float]:
    """One iteration (ties → lowest index; an empty cluster keeps its centroid);
    → (new centroids, inertia of ``centroids``)."""
    k, dim = len(centroids), len(centroids[0])
    sums = [[0.0] * dim for _ in range(k)]
    counts = [0] * k
    inertia = 0.0
    for row in rows:
        distances = [sum((x - c) ** 2 for x, c in zip(row, centroid)) for centroid in centroids]
        j = distances.index(min(distances))
        counts[j] += 1
        inertia += distances[j]
        for d in range(dim):
            sums[j][d] += row[d]
    new = [[s / counts[j] for s in sums[j]] if counts[j] else list(centroids[j]) for j in range(k)]
    return new, inertia


def lloyd(
    rows: list[list[float]], centroids: list[list[float]], iterations: int
) -> tuple[list[list[float]], list[float]]:
    """``iterations`` steps → (final centroids, the inertia of each step's starting centroids)."""
    history = []
    for _ in range(iterations):
        centroids, inertia = lloyd_step(rows, centroids)
        history.append(inertia)
    return centroids, history
