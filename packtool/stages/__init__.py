"""The stages: tokenize, merge, pack (write stages) and stats, verify (read-only stages).

Every write stage has one life: a validated config -> a plan -> independent tasks run by an
executor from `packtool.exec` -> one commit that makes the output visible (`packtool.formats`).
"""
