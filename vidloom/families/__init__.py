"""The model families: one folder each (its networks, cards, loader, loops, program and demo), one declaration each."""
