"""The peer benchmark: one exported FedAvg workload, run by ours and by the frameworks users would
pick instead (docs/performance.md, "Peer benchmark").

``export`` writes the workload; one runner per system reads it (``ours``, ``torch_loop``, ``pfl``,
``flower``), each in its own environment (``make_envs.sh``); ``run`` alternates them and tabulates.
``common`` is what every runner shares, and imports only numpy and the standard library, since each
system's environment has its own packages.
"""
