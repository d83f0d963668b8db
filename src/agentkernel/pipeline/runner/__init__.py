"""The Agent Runner: INPUT message -> agent -> session commit -> OUTPUT reply."""
