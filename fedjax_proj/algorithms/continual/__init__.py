"""The continual-FL family (FOT's task-incremental setting; docs/methods.md, "FOT").

``base`` holds the family's contract (:class:`~.base.ContinualMethod`: a round algorithm plus an
``end_task`` hook) and the round its methods share; ``gpse`` the subspace maths of GPM and FOT.
Methods, one module each: FL (``fl``), EWC+FL (``ewc``), ER+FL (``er``), GPM+FL (``gpm``) and FOT
(``fot``). ``fedjax_proj.training.continual`` drives the tasks. This package imports none of its
modules (the registry imports a method's module when the method is looked up).
"""
