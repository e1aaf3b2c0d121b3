"""The sequential-FL family: clients train one after another along a chain (papers/004).

``base`` holds the family's contract (:class:`~.base.SequentialAlgorithm`) and its chain round for
every execution strategy (the strategy named ``sequential`` is a different thing: a host loop over
clients, fedjax_proj.core.engine). Methods, one module each: FedSeq (``fedseq``), CWC (``cwc``),
SFedKD (``sfedkd``, with its teacher choice in ``teacher_selection``) and the multi-teacher KD
family on FedSeq (``mtkd``: AVER, EBKD, CA-MKD, 004 Table 2). This package imports none of
its modules (the registry imports a method's module when the method is looked up).
"""
