"""Pilots the reproduction claims cite as the source of a budget or of protocol v2's counts
(docs/reproduction.md): kept runnable so the cited numbers can be measured again."""
