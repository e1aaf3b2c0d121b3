"""Performance: step and round throughput, compile time, memory and cost ratios on this machine
(docs/performance.md); ``peer`` runs the same workload in other frameworks."""
