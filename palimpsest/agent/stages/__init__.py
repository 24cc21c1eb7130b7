"""The stages of a turn, each a function (or a small frozen value) that takes what it needs and
returns what it made: sizing the prompt, calling the model, storing what it said, judging its
report, running tools, and the session's upkeep around a turn. ``palimpsest.agent.turn.Turn`` runs
them in order; nothing here holds a turn's state."""
