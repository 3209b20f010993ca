"""``flashml_workloads.sharded_kmeans``, the import path of 0.4's K-means on Ray: it arrives with
the Ray backend, which this release does not have. Until then importing it raises
``ModuleUnavailable`` (an ``ImportError``) that names the ``ray`` extra it will need and says how
K-means runs today: ``flashml_workloads.kmeans_driver`` over a coordinator.
"""

from flashruntime.errors import ModuleUnavailable

raise ModuleUnavailable(
    "flashml_workloads.sharded_kmeans arrives with the Ray backend, which this release does not have yet; "
    "it will need the ray extra (pip install 'flashruntime[ray]'), and installing ray today does not bring it. "
    "K-means runs over a coordinator now: flashml_workloads.kmeans_driver (shard_and_upload, init_centroids, "
    "run_kmeans) submits the 'sharded_kmeans' workload type, one job per Lloyd iteration",
    name=__name__,
)
