"""Knowledge-distillation methods of parallel FL and the distillation maths they share.

Shared pieces: ``distill`` (client logits on a public set, ensemble teachers, the server
distillation loop) and ``distill_server`` (FedAvg followed by server ensemble distillation, with
FedProj's memory). Methods, one module each: FedDF (``feddf``), FedET (``fedet``), FedGKD
(``fedgkd``), FedNTD (``fedntd``) and FedProj (``fedproj``). Modules are imported on demand by the
registry (docs/design.md, "The method registry"); this package imports none of them.
"""
