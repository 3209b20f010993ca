"""Interconnect catalog: one effective bandwidth and latency per ``Interconnect`` value
, used by the communication model.

Bandwidth is bytes/s per direction per GPU at the link's line rate; latency is the
per-hop cost of one collective step, in seconds.
"""

from __future__ import annotations

# interconnect -> (bandwidth bytes/s, latency s)
INTERCONNECTS: dict[str, tuple[float, float]] = {
    # NVLink 3 on A100 SXM: 600 GB/s total bidirectional per GPU = 300 GB/s per direction (NVIDIA A100 datasheet).
    # Latency: NCCL's own tuning model charges ~1 µs per NVLink hop plus a few µs base per collective
    # (NCCL src/graph/tuning.cc, hwLat/baseLat tables); 5 µs is that order of magnitude.
    "same_host_nvlink": (300e9, 5e-6),
    # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s per direction (PCI-SIG, PCIe Base Spec 4.0).
    # Latency: NCCL's model charges ~2x NVLink for a PCI hop (tuning.cc) -> 10 µs.
    "same_host_pcie": (31.5e9, 10e-6),
    # InfiniBand HDR: 200 Gb/s per port = 25 GB/s (NVIDIA ConnectX-6 VPI datasheet; switch + adapter latency
    # "below 1 µs", plus NCCL's ~5 µs network hop in tuning.cc) -> 6 µs.
    "multi_node_ib": (25e9, 6e-6),
    # 100 Gb Ethernet: 12.5 GB/s (IEEE 802.3ba-2010). RoCE/TCP adds software latency over IB; 20 µs.
    "multi_node_100g": (12.5e9, 20e-6),
    # 10 Gb Ethernet: 1.25 GB/s (IEEE 802.3ae-2002); kernel TCP round trips of tens of µs -> 50 µs.
    "multi_node_10g": (1.25e9, 50e-6),
    # WAN: a 1 Gb/s uplink = 0.125 GB/s (IEEE 802.3ab 1000BASE-T line rate as the bottleneck link); latency of
    # 2,000 km of fibre at 2x10^8 m/s (refractive index ~1.47, ITU-T G.652) = 10 ms one way.
    "wan": (0.125e9, 10e-3),
}
